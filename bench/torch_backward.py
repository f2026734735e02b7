"""PyTorch's SDPA backward (FlashAttention-2 and cuDNN backends) on the shapes of gpu_session.sh's
`backward` stage, for the side-by-side rows of bench/RESULTS.md: bf16, B=1, T=32768, median of 10
CUDA-event-timed backward calls after 2 warm-up calls; TFLOP/s at 2.5x the forward's FLOPs (halved
for causal), as `ringattn bench --backward` counts them. With --forward first: the forward calls instead
(TFLOP/s at 4 H T^2 D, halved for causal, as `ringattn bench` counts them). A shape HxDxDv gives v and O
Dv columns (FLOPs 2 H T^2 (D + Dv)); a backend that refuses a shape prints its reason."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_pass(backend, heads, head_dim, v_head_dim, seq, causal, forward):
    q, k, v = (torch.randn(1, heads, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=not forward)
               for d in (head_dim, head_dim, v_head_dim))
    d_o = torch.randn(1, heads, seq, v_head_dim, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(backend):
        out = None if forward else F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        times = []
        for i in range(12):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if forward:
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            else:
                torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True)
            end.record()
            torch.cuda.synchronize()
            if i >= 2:
                times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    seconds = times[len(times) // 2]
    flops = (1 if forward else 2.5) * 2 * heads * seq * seq * (head_dim + v_head_dim) / (2 if causal else 1)
    return seconds, flops / seconds / 1e12


# Optional arguments: --forward, then the shapes as HEADSxHEAD_DIM[xV_HEAD_DIM] (default 32x128 64x64 16x256).
args = sys.argv[1:]
forward = bool(args) and args[0] == "--forward"
shapes = [[int(x) for x in arg.split("x")] for arg in args[forward:]] or [[32, 128], [64, 64], [16, 256]]
backends = (("torch_flash2", SDPBackend.FLASH_ATTENTION), ("torch_cudnn", SDPBackend.CUDNN_ATTENTION),
            ("torch_efficient", SDPBackend.EFFICIENT_ATTENTION))
for causal in (False, True):
    for heads, head_dim, *rest in shapes:
        v_head_dim = rest[0] if rest else head_dim
        dims = f"D={head_dim:4d}" + (f" Dv={v_head_dim:4d}" if v_head_dim != head_dim else "")
        for name, backend in backends[:2] if v_head_dim == head_dim else backends:
            try:
                seconds, tflops = time_pass(backend, heads, head_dim, v_head_dim, 32768, causal, forward)
            except RuntimeError as error:
                print(f"{name:15s} H={heads:3d} {dims} refused: {str(error).splitlines()[0][:120]}")
                continue
            print(f"{name:15s} H={heads:3d} {dims} T=32768 causal={int(causal)} "
                  f"time_ms={seconds * 1e3:9.3f} {'fwd' if forward else 'bwd'}_TFLOP/s={tflops:7.2f}")
            torch.cuda.empty_cache()
