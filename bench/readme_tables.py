"""The README's performance tables from one `gpu_session.sh ... readme_tables 2` call's readme_tables.txt: our
`bench --backward` rows, each after its label (`one_gpu:IMPL:HxD` or `ring:IMPL:HxD`, IMPL the local kernel), and
PyTorch's lines in the same file (bench/torch_backward.py: `torch_flash2` / `torch_cudnn`, forward and backward;
bench/torch_context_parallel.py: `context_parallel_cudnn` / `_flash`). Prints markdown: one GPU at T = 32768 by
head dim, forward and backward; the ring of 2 per GPU beside one GPU and context_parallel. Each cell is
non-causal / causal TFLOP/s; a cell nobody measured reads `-`, one a kernel refused reads `refused`.

Usage: python3 bench/readme_tables.py readme_tables.txt
"""
import re
import sys

# (who, T, H, D, causal, pass) -> TFLOP/s; who: "one_gpu:cudnn", "ring:flash_attn2", "torch_cudnn", ...
rates = {}
refused = set()  # (who, H, D): a labelled line that is no row, the kernel's refusal


def read(lines):
    rates.clear()
    refused.clear()
    for line in lines:
        fields = line.split()
        if not fields:
            continue
        if fields[0].startswith(("one_gpu:", "ring:")):
            kind, impl, shape = fields[0].split(":")
            who = f"{kind}:{impl}"
            if len(fields) >= 14 and fields[1] in ("cudnn", "flash_attn2", "ring"):
                _, _, _, _, t, h, _, d, _, causal, pass_, _, tflops = fields[1:14]
                rates[(who, int(t), int(h), int(d), int(causal), pass_)] = float(tflops)
            elif "peak device memory" not in line:
                h, d = shape.split("x")
                refused.add((who, int(h), int(d)))
        elif fields[0] in ("torch_flash2", "torch_cudnn"):
            numbers = dict(re.findall(r"(\w+)=\s*(\d+)", line))
            measured = re.search(r"(fwd|bwd)_TFLOP/s=\s*([\d.]+)", line)
            if "refused" in line:
                refused.add((fields[0], int(numbers["H"]), int(numbers["D"])))
            if measured and "Dv" not in numbers:
                pass_ = "forward" if measured.group(1) == "fwd" else "backward"
                rates[(fields[0], int(numbers["T"]), int(numbers["H"]), int(numbers["D"]), int(numbers["causal"]),
                       pass_)] = float(measured.group(2))
        elif fields[0].startswith("context_parallel_"):
            numbers = dict(re.findall(r"(\w+)=\s*(\d+)", line))
            for pass_, key in (("forward", "fwd"), ("backward", "bwd")):
                value = re.search(key + r"_TFLOP/s/GPU=\s*([\d.]+)", line)
                rates[(fields[0], int(numbers["T"]), int(numbers["H"]), int(numbers["D"]), int(numbers["causal"]),
                       pass_)] = float(value.group(1))


def cell(who, t, h, d, pass_):
    values = [rates.get((who, t, h, d, causal, pass_)) for causal in (0, 1)]
    if values == [None, None]:
        return "refused" if (who, h, d) in refused else "-"
    return " / ".join("-" if v is None else f"{v:.1f}" for v in values)


def share(ring, one, t, h, d, pass_):
    values = []
    for causal in (0, 1):
        a, b = rates.get((ring, t, h, d, causal, pass_)), rates.get((one, t, h, d, causal, pass_))
        values.append("-" if a is None or b is None else f"{100 * a / b:.0f}%")
    return " / ".join(values)


def one_gpu_table(pass_):
    # Every shape measured at T = 32768 on one GPU, either pass, or refused there.
    shapes = sorted({(h, d) for (who, t, h, d, _, _) in rates if t == 32768 and not who.startswith("ring")} |
                    {(h, d) for (_, h, d) in refused}, key=lambda shape: shape[1])
    rows = [("`cudnn` (ours)", "one_gpu:cudnn"), ("PyTorch SDPA cuDNN", "torch_cudnn"),
            ("`flash_attn2` (ours)", "one_gpu:flash_attn2"), ("PyTorch SDPA FlashAttention-2", "torch_flash2")]
    out = [f"| {pass_}, one GPU, T=32768 | " + " | ".join(f"H={h} D={d}" for h, d in shapes) + " |",
           "|---" * (len(shapes) + 1) + "|"]
    for name, who in rows:
        cells = [cell(who, 32768, h, d, pass_) for h, d in shapes]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def ring_table():
    seqs = sorted({t for (who, t, *_) in rates if who.startswith("ring:")})
    columns = [(t, p) for t in seqs for p in ("forward", "backward")]
    out = ["| 2 GPUs, per GPU, H=32 D=128 | " + " | ".join(f"T={t} {p}" for t, p in columns) + " |",
           "|---" * (len(columns) + 1) + "|"]
    for local, cp, one in (("cudnn", "context_parallel_cudnn", "one_gpu:cudnn"),
                           ("flash_attn2", "context_parallel_flash", "one_gpu:flash_attn2")):
        out.append(f"| `ring`, `{local}` steps | " + " | ".join(cell(f"ring:{local}", t, 32, 128, p) for t, p in columns) + " |")
        out.append(f"| its share of one GPU's `{local}` | " +
              " | ".join(share(f"ring:{local}", one, t, 32, 128, p) for t, p in columns) + " |")
        out.append(f"| PyTorch `context_parallel`, {'cuDNN' if local == 'cudnn' else 'FlashAttention-2'} | " +
              " | ".join(cell(cp, t, 32, 128, p) for t, p in columns) + " |")
    for local in ("cudnn", "flash_attn2"):
        out.append(f"| one GPU's `{local}` (global T) | " + " | ".join(cell(f"one_gpu:{local}", t, 32, 128, p)
                                                                   for t, p in columns) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    read(open(sys.argv[1]))
    print("\n".join((one_gpu_table("forward"), one_gpu_table("backward"), ring_table())))
