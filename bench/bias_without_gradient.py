"""What a bias that takes no gradient (an attention mask given as a float bias, as Hugging Face passes one)
costs ringattn's backward beside a bias whose gradient is formed, with PyTorch's SDPA (memory-efficient
backend, attn_mask without gradient) beside, for bench/RESULTS.md. One (1, 1, T, T) float32 bias (bfloat16
for SDPA), random, -inf above the diagonal with --causal 1 (SDPA takes no is_causal beside attn_mask; ringattn
takes causal=True as well). bf16, B=1, median of 10 CUDA-event-timed backward calls after 2 warm-up calls;
TFLOP/s as ringattn bench counts them (2.5 x 4 H T^2 D, halved for causal).
Arguments: --seq --heads --head-dim (default 8192 x 16 x 128) --causal 0 | 1."""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ringattn.torch as rt
from bench_common import add_shape_arguments, median_ms

parser = argparse.ArgumentParser()
add_shape_arguments(parser, seq=8192)
parser.set_defaults(heads=16)
args = parser.parse_args()
T, H, D, causal = args.seq, args.heads, args.head_dim, bool(args.causal)
flops = 2.5 * 4 * H * D * T * T / (2 if causal else 1)

bias = torch.randn(1, 1, T, T, device="cuda")
if causal:
    bias.masked_fill_(torch.ones(T, T, device="cuda", dtype=torch.bool).triu(1), float("-inf"))


def backward_ms(attend, layout, bias_grad):
    shape = (1, T, H, D) if layout == "bshd" else (1, H, T, D)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    b = bias.clone().requires_grad_(bias_grad)
    out = attend(q, k, v, b)
    d_o = torch.randn_like(out)
    inputs = (q, k, v, b) if bias_grad else (q, k, v)
    return median_ms(lambda: torch.autograd.grad(out, inputs, d_o, retain_graph=True), 10, warmup=2)


def ours(q, k, v, b):
    return rt.attention(q, k, v, bias=b, causal=causal, impl="flash_attn2")


def sdpa_efficient(q, k, v, b):
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=b.to(torch.bfloat16))


times = {}
for name, attend, layout, bias_grad in (("ringattn flash_attn2, bias with gradient", ours, "bshd", True),
                                        ("ringattn flash_attn2, bias without gradient", ours, "bshd", False),
                                        ("sdpa efficient, attn_mask with gradient", sdpa_efficient, "bhsd", True),
                                        ("sdpa efficient, attn_mask without gradient", sdpa_efficient, "bhsd", False)):
    ms = times[name] = backward_ms(attend, layout, bias_grad)
    print(f"{name:45s} H={H} D={D} T={T} causal={int(causal)} bwd_ms={ms:8.3f} "
          f"bwd_TFLOP/s={flops / ms / 1e9:7.2f}", flush=True)
names = list(times)
print(f"ringattn without / with the bias's gradient: {times[names[0]] / times[names[1]]:.2f}x faster; "
      f"ringattn / sdpa efficient, both without: {times[names[3]] / times[names[1]]:.2f}x", flush=True)
