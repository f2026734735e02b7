"""A model of one ring step: when does the ring hide its transfers?

At each of its N steps a rank computes attention of its T/N queries against one K/V block of T/N keys
while the next block travels over the link. With per-GPU kernel rate R (FLOP/s) and link bandwidth W
(bytes/s, one direction), per step:
    compute  c = 4 B H t^2 D f / R            t = T / N tokens per GPU, f = 1/2 causal (zigzag), else 1
    transfer x = 2 B Hkv t D e / W            K and V in e-byte elements
and the backward computes 2.5x the forward's FLOPs while dK / dV travel beside K / V in f32:
    c_bwd = 2.5 c, x_bwd = 2 B Hkv t D (e + 4) / W.
The ring takes (N - 1) max(c, x) + c (the last step has nothing in flight), so it hides every transfer
from t* = Hkv e R / (2 H f W) tokens per GPU (forward; the backward needs (e + 4) / (2.5 e) times that).

Run: /usr/bin/python3 bench/ring_model.py [--png FILE]   (matplotlib only for the PNG)
Prints t* per link and kernel, and the model against the rings measured on 2 H200 (forward, NVLink and
sockets) and on 2 H100 (forward and backward, f32 and bf16 gradient wire), with the flash kernel's one-GPU
rate at each block size (it falls on small blocks), and what chunked blocks would gain there.
"""
import argparse

GB = 1e9
# Links, one direction, bytes/s. NVLink: NCCL send/recv between the 2 H200 measured 2026-11-21 (device
# README); sockets: the exchange times of the issue-23 trial below (2.15-2.69 GB/s, mean taken).
LINKS = {"NVLink (H200 pair)": 300 * GB, "InfiniBand NDR (400 Gb/s)": 50 * GB, "100 GbE": 12.5 * GB,
         "TCP sockets (loopback)": 2.45 * GB}
# Kernel rates on one H200, bf16, H=32 D=128, TFLOP/s (README / bench/RESULTS.md, 2026-11-23).
# The backward's gradient wire in bytes (f32 4, bf16 2); flash_attn2 backward: the wgmma kernel, 2026-11-24.
KERNELS = {"flash_attn2 forward": (372.6e12, False, 0), "cudnn forward": (550.3e12, False, 0),
           "flash_attn2 backward": (327.5e12, True, 4), "cudnn backward": (523.0e12, True, 4),
           "cudnn bwd, bf16 wire": (523.0e12, True, 2)}
# The flash_attn2 forward's rate falls on small blocks: one H200, causal, against tokens (README table and
# RESULTS' issue-19 round, 2026-11-23), interpolated in log(tokens) for the model's curves.
FLASH_CAUSAL_BY_TOKENS = {8192: 331.1e12, 32768: 351.3e12, 131072: 372.6e12}


def flash_rate(t):
    return interpolate(FLASH_CAUSAL_BY_TOKENS, t)


# Measured on 2 H200, flash_attn2 steps, causal zigzag, H=32 D=128 bf16 (issue 23's trial): per-GPU
# TFLOP/s against global T, over NVLink and over NCCL's socket path (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1).
MEASURED = {"NVLink (H200 pair)": {16384: 298, 65536: 349, 262144: 365},
            "TCP sockets (loopback)": {16384: 18, 65536: 67, 262144: 231}}


# 2 H100 (nvidia-h100-x2), 2026-11-27, the same ring and shape (bench/results/h100x2_2026-11-27_network.txt): the
# flash kernel's one-GPU rates (causal, forward / backward) at the ring's block sizes, and per-GPU TFLOP/s of
# the ring over NVLink and over NCCL's socket path, forward, and backward with the f32 and the bf16 gradient wire.
# Its sockets moved 1.5 GB/s for blocks of 134-537 MB and 2.3 GB/s for 2.1 GB ones; 2.0 GB/s fits them best.
H100_FORWARD = {8192: 341.1e12, 32768: 403.1e12, 65536: 396.2e12}
H100_BACKWARD = {8192: 281.0e12, 32768: 329.2e12, 65536: 329.3e12}
H100_LINKS = {"NVLink (H100 pair)": 300 * GB, "TCP sockets (loopback)": 2.0 * GB}
H100_MEASURED = {  # (link, pass, gradient wire bytes) -> {T: per-GPU TFLOP/s}
    ("NVLink (H100 pair)", "forward", 0): {16384: 321.0, 65536: 381.2, 262144: 384.8},
    ("NVLink (H100 pair)", "backward", 4): {16384: 230.4, 65536: 297.3, 131072: 300.0},
    ("TCP sockets (loopback)", "forward", 0): {16384: 12.3, 65536: 46.8, 262144: 217.1},
    ("TCP sockets (loopback)", "backward", 4): {16384: 15.5, 65536: 49.6, 131072: 90.5},
    ("TCP sockets (loopback)", "backward", 2): {16384: 17.1, 65536: 73.9, 131072: 120.9},
}


def interpolate(table, t):
    """A rate from {tokens: rate}, interpolated in log(tokens), held flat outside the table."""
    import math
    points = sorted(table.items())
    if t <= points[0][0]:
        return points[0][1]
    for (t0, r0), (t1, r1) in zip(points, points[1:]):
        if t <= t1:
            return r0 + math.log(t / t0) / math.log(t1 / t0) * (r1 - r0)
    return points[-1][1]


def step_times(t, heads, kv_heads, head_dim, elem, rate, bandwidth, causal, backward, grad_elem=4):
    f = 0.5 if causal else 1.0
    compute = 4 * heads * t * t * head_dim * f / rate * (2.5 if backward else 1.0)
    transfer = 2 * kv_heads * t * head_dim * (elem + (grad_elem if backward else 0)) / bandwidth
    return compute, transfer


def per_gpu_rate(T, n, rate, bandwidth, heads=32, kv_heads=32, head_dim=128, elem=2, causal=True, backward=False,
                 grad_elem=4, chunks=1):
    """Predicted per-GPU TFLOP/s of a ring of n GPUs over a sequence of T tokens (blocks cut in `chunks`)."""
    t = T / n
    c, x = step_times(t, heads, kv_heads, head_dim, elem, rate, bandwidth, causal, backward, grad_elem)
    seconds = (n - 1) * max(c, x) + c if chunks == 1 else max(n * c, (n - 1) * x + c / chunks)
    return n * c / seconds * rate / 1e12  # the ring's FLOPs are n steps of c at `rate`


def hiding_tokens(rate, bandwidth, heads=32, kv_heads=32, elem=2, causal=True, backward=False, grad_elem=4):
    """Smallest tokens per GPU at which a step's compute covers its transfer."""
    f = 0.5 if causal else 1.0
    t = kv_heads * elem * rate / (2 * heads * f * bandwidth)
    return t * (elem + grad_elem) / (2.5 * elem) if backward else t


def decorate(axes, gpu, kind, title):
    axes.set_xscale("log", base=2)
    axes.set_xlabel(f"tokens per GPU (ring of 2 {gpu}, causal zigzag, H=32 D=128 bf16)")
    axes.set_ylabel(f"per-GPU TFLOP/s (flash_attn2 {kind} steps)")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", help="plot predicted and measured per-GPU TFLOP/s to this file")
    args = parser.parse_args()
    print("tokens per GPU from which the ring hides every transfer (H = Hkv = 32, D = 128, bf16, causal zigzag):")
    print(f"{'link':28s}" + "".join(f"{k:>23s}" for k in KERNELS))
    for link, bandwidth in LINKS.items():
        cells = "".join(f"{hiding_tokens(rate, bandwidth, backward=bwd, grad_elem=grad):23,.0f}"
                        for rate, bwd, grad in KERNELS.values())
        print(f"{link:28s}{cells}")
    print("\nthe model against the measured 2-GPU ring (flash_attn2 forward steps, causal, per-GPU TFLOP/s):")
    for link, points in MEASURED.items():
        for T, measured in points.items():
            predicted = per_gpu_rate(T, 2, flash_rate(T / 2), LINKS[link])
            print(f"  {link:24s} T={T:7d}: predicted {predicted:6.1f}, measured {measured:6.1f} "
                  f"({predicted / measured - 1:+.0%})")
    print("\nthe model against the 2-H100 ring (flash_attn2 steps, causal, per-GPU TFLOP/s; sockets at 2.0 GB/s),")
    print("and what blocks cut in 8 chunks would give:")
    h100_rows = []
    for (link, kind, grad), points in H100_MEASURED.items():
        backward = kind == "backward"
        for T, measured in points.items():
            rate = interpolate(H100_BACKWARD if backward else H100_FORWARD, T / 2)
            args_ = dict(backward=backward, grad_elem=grad)
            predicted = per_gpu_rate(T, 2, rate, H100_LINKS[link], **args_)
            chunked = per_gpu_rate(T, 2, rate, H100_LINKS[link], chunks=8, **args_)
            wire = f", {'f32' if grad == 4 else 'bf16'} wire" if backward else ""
            print(f"  {link:24s} {kind:8s}{wire:10s} T={T:7d}: predicted {predicted:6.1f}, measured {measured:6.1f} "
                  f"({predicted / measured - 1:+.0%}); 8 chunks {chunked:6.1f} ({chunked / predicted:.2f}x)")
            h100_rows.append((link, kind, grad, T, predicted, measured))
    if args.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8))
        tokens = [2 ** k for k in range(10, 21)]
        for (link, bandwidth), color in zip(LINKS.items(), ("C0", "C1", "C2", "C3")):
            ax.plot(tokens, [per_gpu_rate(2 * t, 2, flash_rate(t), bandwidth) for t in tokens], color=color, label=f"model, {link}")
            if link in MEASURED:
                points = MEASURED[link]
                ax.plot([T / 2 for T in points], list(points.values()), "o", color=color, label=f"measured, {link}")
        decorate(ax, "H200", "forward", "When the ring hides its K/V transfers")
        for (link, bandwidth), color in zip(H100_LINKS.items(), ("C0", "C3")):
            for grad, style in ((4, "-"), (2, "--")):
                measured = H100_MEASURED.get((link, "backward", grad))
                if not measured:
                    continue
                wire = "f32" if grad == 4 else "bf16"
                bx.plot(tokens, [per_gpu_rate(2 * t, 2, interpolate(H100_BACKWARD, t), bandwidth, backward=True,
                                              grad_elem=grad) for t in tokens], style, color=color,
                        label=f"model, {link}, {wire} gradient wire")
                bx.plot([T / 2 for T in measured], list(measured.values()), "o" if grad == 4 else "s", color=color,
                        label=f"measured, {link}, {wire} gradient wire")
        decorate(bx, "H100", "backward", "The backward: dK / dV travel beside K / V")
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()
