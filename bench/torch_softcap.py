"""PyTorch's FlexAttention with a logit soft cap (score_mod cap * tanh(score / cap), torch.compile'd: PyTorch's
way to train with Gemma-2-style capped logits; SDPA has no soft cap), beside `ringattn bench --softcap 50`:
bf16, B=1, T=32768, median of 10 CUDA-event-timed calls after 2 warm-up calls; forward TFLOP/s at
4 H T^2 D (halved for causal), the backward at 2.5x, as ringattn bench counts them.
Arguments: HEADSxHEAD_DIM ... (default 32x128 16x256)."""
import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from bench_common import median_ms

T, CAP = 32768, 50.0


def soft_cap(score, b, h, q, kv):
    return CAP * torch.tanh(score / CAP)


def run(heads, head_dim, causal):
    mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, T, T, device="cuda") if causal else None
    attend = torch.compile(flex_attention)
    q, k, v = (torch.randn(1, heads, T, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    d_o = torch.randn(1, heads, T, head_dim, device="cuda", dtype=torch.bfloat16)
    forward_ms = median_ms(lambda: attend(q, k, v, score_mod=soft_cap, block_mask=mask), 10, warmup=2)
    out = attend(q, k, v, score_mod=soft_cap, block_mask=mask)
    backward_ms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True), 10, warmup=2)
    flops = 4 * heads * head_dim * T * T / (2 if causal else 1)
    print(f"torch_flex_softcap H={heads:3d} D={head_dim:4d} T={T} causal={int(causal)} fwd_ms={forward_ms:8.3f} "
          f"fwd_TFLOP/s={flops / forward_ms / 1e9:7.2f} bwd_ms={backward_ms:8.3f} "
          f"bwd_TFLOP/s={2.5 * flops / backward_ms / 1e9:7.2f}", flush=True)


shapes = [tuple(int(x) for x in arg.split("x")) for arg in sys.argv[1:]] or [(32, 128), (16, 256)]
for causal in (False, True):
    for heads, head_dim in shapes:
        try:
            run(heads, head_dim, causal)
        except Exception as error:  # report and go on: one PyTorch lacks one path or another
            print(f"torch_flex_softcap H={heads} D={head_dim} causal={int(causal)} failed: {type(error).__name__}: "
                  f"{str(error).splitlines()[0] if str(error) else ''}", flush=True)
