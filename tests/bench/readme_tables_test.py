"""bench/readme_tables.py on a readme_tables.txt shaped as gpu_session.sh writes it (no GPU): rows land in their
cells by label, shape, T and mask; shares are ring over one GPU at the same T; a kernel's refusal reads
`refused`, a cell nobody measured `-`."""
import importlib.util
import pathlib

spec = importlib.util.spec_from_file_location(
    "readme_tables", pathlib.Path(__file__).resolve().parents[2] / "bench" / "readme_tables.py")
tables = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tables)


def row(label, impl, ranks, t, h, d, causal, pass_, tflops):
    return (f"{label}  {impl:>11s} cuda {ranks:5d} 1 {t:8d} {h:4d} {h:4d} {d:4d} bf16 {causal:6d} {pass_:>17s} "
            f"1.000 {tflops:11.3f} -")


LOG = [
    row("one_gpu:cudnn:32x128", "cudnn", 1, 32768, 32, 128, 0, "forward", 560.0),
    row("one_gpu:cudnn:32x128", "cudnn", 1, 32768, 32, 128, 1, "forward", 540.0),
    row("one_gpu:cudnn:32x128", "cudnn", 1, 32768, 32, 128, 0, "backward", 520.0),
    "one_gpu:cudnn:32x128   peak device memory of the backward 1.88 GiB (...)",
    "one_gpu:cudnn:16x192 ringattn bench: q dimension 3 (head_dim) is 192 and v dimension 3 (v_head_dim) is 192",
    row("one_gpu:flash_attn2:16x192", "flash_attn2", 1, 32768, 16, 192, 1, "backward", 280.0),
    row("one_gpu:flash_attn2:32x128", "flash_attn2", 1, 16384, 32, 128, 0, "backward", 400.0),
    row("ring:flash_attn2:32x128", "ring", 2, 16384, 32, 128, 0, "backward", 380.0),
    "torch_cudnn     H= 32 D= 128 T=32768 causal=0 time_ms=   12.000 bwd_TFLOP/s= 540.00",
    "torch_cudnn     H= 16 D= 192 refused: No available kernel",
    "context_parallel_flash gpus=2 T=16384 H=32 D=128 causal=0 fwd_ms=   4.6 fwd_TFLOP/s/GPU= 284.8 bwd_ms=  12.9 "
    "bwd_TFLOP/s/GPU= 249.0",
]


def cells(table, name):
    [line] = [line for line in table.splitlines() if line.startswith(f"| {name} |")]
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_one_gpu_cells_by_shape_and_mask():
    tables.read(LOG)
    forward, backward = tables.one_gpu_table("forward"), tables.one_gpu_table("backward")
    assert forward.splitlines()[0] == "| forward, one GPU, T=32768 | H=32 D=128 | H=16 D=192 |"
    assert cells(forward, "`cudnn` (ours)") == ["560.0 / 540.0", "refused"]
    assert cells(backward, "`cudnn` (ours)") == ["520.0 / -", "refused"]
    assert cells(backward, "`flash_attn2` (ours)") == ["-", "- / 280.0"]
    assert cells(backward, "PyTorch SDPA cuDNN") == ["540.0 / -", "refused"]


def test_ring_share_and_context_parallel():
    tables.read(LOG)
    ring = tables.ring_table()
    assert ring.splitlines()[0] == "| 2 GPUs, per GPU, H=32 D=128 | T=16384 forward | T=16384 backward |"
    assert cells(ring, "`ring`, `flash_attn2` steps") == ["-", "380.0 / -"]
    assert cells(ring, "its share of one GPU's `flash_attn2`") == ["- / -", "95% / -"]
    assert cells(ring, "PyTorch `context_parallel`, FlashAttention-2") == ["284.8 / -", "249.0 / -"]
