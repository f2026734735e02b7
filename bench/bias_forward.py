"""The forward with an additive bias: ringattn's flash_attn2 (the wgmma bias instance at head_dim 64 / 128)
beside PyTorch's SDPA memory-efficient backend given the same bias as attn_mask, for bench/RESULTS.md. One
(1, 1, T, T) float32 bias (bfloat16 for SDPA), random, -inf above the diagonal with --causal 1 (SDPA takes no
is_causal beside attn_mask; ringattn takes causal=True as well). bf16, B=1, median of 10 CUDA-event-timed
calls after 2 warm-up calls, under no_grad; TFLOP/s as ringattn bench counts them (4 H T^2 D, halved for causal).
Arguments: --seq --heads --head-dim (default 16384 x 16 x 128) --causal 0 | 1."""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ringattn.torch as rt
from bench_common import add_shape_arguments, median_ms

parser = argparse.ArgumentParser()
add_shape_arguments(parser, seq=16384)
parser.set_defaults(heads=16)
args = parser.parse_args()
T, H, D, causal = args.seq, args.heads, args.head_dim, bool(args.causal)
flops = 4 * H * D * T * T / (2 if causal else 1)

bias = torch.randn(1, 1, T, T, device="cuda")
if causal:
    bias.masked_fill_(torch.ones(T, T, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
sdpa_bias = bias.to(torch.bfloat16)


def forward_ms(attend, shape):
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        return median_ms(lambda: attend(q, k, v), 10, warmup=2)


def ours(q, k, v):
    return rt.attention(q, k, v, bias=bias, causal=causal, impl="flash_attn2")


def sdpa_efficient(q, k, v):
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_bias)


ours_ms = forward_ms(ours, (1, T, H, D))
sdpa_ms = forward_ms(sdpa_efficient, (1, H, T, D))
for name, ms in (("ringattn flash_attn2", ours_ms), ("sdpa efficient, attn_mask", sdpa_ms)):
    print(f"{name:28s} H={H} D={D} T={T} causal={int(causal)} fwd_ms={ms:8.3f} fwd_TFLOP/s={flops / ms / 1e9:7.2f}",
          flush=True)
print(f"ringattn / sdpa efficient: {sdpa_ms / ours_ms:.2f}x faster", flush=True)
