"""PyTorch beside `ringattn bench --bias / --mask / --dropout / --softcap --segments`, for bench/RESULTS.md:
the ways a PyTorch user trains with those options. Bias (one (T, S) matrix broadcast over heads, gradient
taken): SDPA's attn_mask on its memory-efficient and cuDNN backends, and FlexAttention's score_mod reading
it; the bias beside dropout 0.1: SDPA's efficient backend (bias_dropout, not run by default); a boolean mask (7 / 8
of the pairs kept): FlexAttention's mask_mod reading it and SDPA's efficient backend; dropout 0.1: SDPA's
FlashAttention-2 backend; a soft cap of 50 on packed documents: FlexAttention.
bf16, B=1, median of 10 CUDA-event-timed calls after 2 warm-up calls; TFLOP/s as ringattn bench counts them
(4 H T^2 D, halved for causal, divided by the documents; the backward 2.5x).
Arguments: --seq --heads --head-dim (default 16384 x 32 x 128) --causal 0 | 1, --only bias,mask,dropout,softcap
or bias_dropout (the rows to run; the first four by default)."""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from bench_common import add_shape_arguments, median_ms

parser = argparse.ArgumentParser()
add_shape_arguments(parser, seq=16384)
parser.add_argument("--only", default="bias,mask,dropout,softcap")
args = parser.parse_args()
wanted = set(args.only.split(","))
T, H, D, causal = args.seq, args.heads, args.head_dim, bool(args.causal)
flex = torch.compile(flex_attention)


def tensors():
    q, k, v = (torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16)


def report(name, attend, inputs, docs=1):
    """Times attend() (forward) and the gradients of `inputs` through its output (backward)."""
    try:
        forward_ms = median_ms(attend, 10, warmup=2)
        out = attend()
        d_o = torch.randn_like(out)
        backward_ms = median_ms(lambda: torch.autograd.grad(out, inputs, d_o, retain_graph=True), 10, warmup=2)
    except Exception as error:  # report and go on: one PyTorch lacks one path or another
        print(f"{name:27s} H={H} D={D} T={T} causal={int(causal)} failed: {type(error).__name__}: "
              f"{str(error).splitlines()[0] if str(error) else ''}", flush=True)
        return
    flops = 4 * H * D * T * T / docs / (2 if causal else 1)
    print(f"{name:27s} H={H:3d} D={D:4d} T={T} causal={int(causal)} fwd_ms={forward_ms:8.3f} "
          f"fwd_TFLOP/s={flops / forward_ms / 1e9:7.2f} bwd_ms={backward_ms:8.3f} "
          f"bwd_TFLOP/s={2.5 * flops / backward_ms / 1e9:7.2f}", flush=True)


q, k, v, _ = tensors()
causal_mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, T, T, device="cuda") if causal else None


def random_bias():
    """One (T, S) bias broadcast over batch and heads, gradient taken. SDPA takes no is_causal beside attn_mask:
    causal goes into the bias as -inf."""
    bias = torch.randn(1, 1, T, T, device="cuda", dtype=torch.bfloat16)
    if causal:
        bias.masked_fill_(torch.ones(T, T, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    return bias.requires_grad_(True)


# Bias with its gradient.
if "bias" in wanted:
    bias = random_bias()
    for backend, name in ((SDPBackend.EFFICIENT_ATTENTION, "sdpa_efficient_bias"), (SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn_bias")):
        def attend(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        report(name, attend, (q, k, v, bias))
    bias_matrix = bias.detach()[0, 0].float().requires_grad_(True)
    report("flex_bias", lambda: flex(q, k, v, score_mod=lambda s, b, h, i, j: s + bias_matrix[i, j], block_mask=causal_mask),
           (q, k, v, bias_matrix))
    del bias, bias_matrix

# The same bias beside dropout 0.1: SDPA's memory-efficient backend (FlashAttention-2's takes no bias).
if "bias_dropout" in wanted:
    bias = random_bias()
    def attend_bias_dropout():
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.1)
    report("sdpa_efficient_bias_dropout", attend_bias_dropout, (q, k, v, bias))
    del bias

# A boolean mask, 7 / 8 of the pairs kept.
if "mask" in wanted:
    keep = torch.rand(T, T, device="cuda") < 7 / 8
    if causal:
        keep &= torch.ones(T, T, device="cuda", dtype=torch.bool).tril()
    mask = create_block_mask(lambda b, h, i, j: keep[i, j], None, None, T, T, device="cuda")
    report("flex_mask", lambda: flex(q, k, v, block_mask=mask), (q, k, v))
    keep4 = keep[None, None]
    def attend_masked():
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep4)
    report("sdpa_efficient_mask", attend_masked, (q, k, v))
    del keep, keep4, mask

# Dropout 0.1 on FlashAttention-2.
if "dropout" in wanted:
    def attend_dropout():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=causal)
    report("sdpa_flash_dropout", attend_dropout, (q, k, v))

# A soft cap of 50 on 16 packed documents.
if "softcap" in wanted:
    DOCS = 16
    doc = torch.arange(T, device="cuda") * DOCS // T
    documents = create_block_mask(lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j) if causal else doc[i] == doc[j],
                                  None, None, T, T, device="cuda")
    report("flex_softcap_documents", lambda: flex(q, k, v, score_mod=lambda s, b, h, i, j: 50.0 * torch.tanh(s / 50.0),
                                                  block_mask=documents), (q, k, v), docs=DOCS)
