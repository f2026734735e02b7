"""PyTorch on packed documents, for the side-by-side rows of bench/RESULTS.md beside `ringattn bench
--segments N`: FlexAttention with a document block mask (torch.compile'd, the PyTorch way to train on
packed documents) and, where this PyTorch runs it, SDPA on jagged nested tensors (FlashAttention-2's
variable-length kernel). bf16, B=1, T=32768 split into N documents of T / N rows; median of 10
CUDA-event-timed calls after 2 warm-up calls; TFLOP/s count the pairs inside documents (halved for
causal), the backward at 2.5x the forward, as ringattn bench counts them. Beside them, where ringattn is
importable: ringattn.torch.attention_varlen on the same packed tensors (flash_attn2: one call with segment ids;
cudnn: a call a document), cu_seqlens on the GPU as a training loop holds them.
Arguments: HEADSxHEAD_DIMxDOCUMENTS ... (default 16x128x16 16x128x64); --runs NAME,NAME (default all of
flex, varlen, ringattn_varlen, ringattn_varlen_cudnn); --softcap CAP: Gemma-2's capped logits on packed documents
(FlexAttention's score_mod cap * tanh(score / cap), ringattn's softcap; SDPA and cudnn have none: not run)."""
import sys

import torch
import torch.nn.functional as F

T = 32768
SOFTCAP = 0.0  # --softcap


def median_ms(fn):
    times = []
    for i in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def report(name, heads, head_dim, docs, causal, forward_ms, backward_ms):
    name += "_softcap" if SOFTCAP > 0 else ""
    flops = 4 * heads * head_dim * T * T / docs / (2 if causal else 1)
    print(f"{name:12s} H={heads:3d} D={head_dim:4d} T={T} documents={docs:4d} causal={int(causal)} "
          f"fwd_ms={forward_ms:8.3f} fwd_TFLOP/s={flops / forward_ms / 1e9:7.2f} "
          f"bwd_ms={backward_ms:8.3f} bwd_TFLOP/s={2.5 * flops / backward_ms / 1e9:7.2f}", flush=True)


def flex(heads, head_dim, docs, causal):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    doc = torch.arange(T, device="cuda") * docs // T

    def same_document(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv) if causal else doc[q] == doc[kv]

    def soft_cap(score, b, h, q, kv):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    mask = create_block_mask(same_document, None, None, T, T, device="cuda")
    attend = torch.compile(flex_attention)
    score_mod = soft_cap if SOFTCAP > 0 else None
    q, k, v = (torch.randn(1, heads, T, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_o = torch.randn(1, heads, T, head_dim, device="cuda", dtype=torch.bfloat16)
    forward_ms = median_ms(lambda: attend(q, k, v, score_mod=score_mod, block_mask=mask))
    out = attend(q, k, v, score_mod=score_mod, block_mask=mask)
    backward_ms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True))
    report("torch_flex", heads, head_dim, docs, causal, forward_ms, backward_ms)


def varlen(heads, head_dim, docs, causal):
    if SOFTCAP > 0:
        raise NotImplementedError("SDPA has no soft cap")
    offsets = torch.arange(0, T + 1, T // docs, device="cuda", dtype=torch.int64)

    def jagged():
        values = torch.randn(T, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        return values, torch.nested.nested_tensor_from_jagged(values, offsets).transpose(1, 2)

    (qv, q), (kv, k), (vv, v) = jagged(), jagged(), jagged()
    attend = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    forward_ms = median_ms(attend)
    out = attend().transpose(1, 2).values()
    d_o = torch.randn_like(out)
    backward_ms = median_ms(lambda: torch.autograd.grad(out, (qv, kv, vv), d_o, retain_graph=True))
    report("torch_varlen", heads, head_dim, docs, causal, forward_ms, backward_ms)


def ringattn_varlen(heads, head_dim, docs, causal, impl="flash_attn2"):
    import ringattn.torch as rt

    cu = torch.arange(0, T + 1, T // docs, device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(T, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    if SOFTCAP > 0 and impl == "cudnn":
        raise NotImplementedError("cudnn has no soft cap")
    attend = lambda: rt.attention_varlen(q, k, v, cu, cu, causal=causal, impl=impl, softcap=SOFTCAP)  # noqa: E731
    forward_ms = median_ms(attend)
    out = attend()
    d_o = torch.randn_like(out)
    backward_ms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), d_o, retain_graph=True))
    report("ringattn_varlen" + ("_cudnn" if impl == "cudnn" else ""), heads, head_dim, docs, causal, forward_ms,
           backward_ms)


def ringattn_varlen_cudnn(heads, head_dim, docs, causal):
    ringattn_varlen(heads, head_dim, docs, causal, impl="cudnn")


RUNS = {f.__name__: f for f in (flex, varlen, ringattn_varlen, ringattn_varlen_cudnn)}
args = sys.argv[1:]
chosen = list(RUNS)
if "--runs" in args:
    at = args.index("--runs")
    chosen, args = args[at + 1].split(","), args[:at] + args[at + 2:]
if "--softcap" in args:
    at = args.index("--softcap")
    SOFTCAP, args = float(args[at + 1]), args[:at] + args[at + 2:]
shapes = [tuple(int(x) for x in arg.split("x")) for arg in args] or [(16, 128, 16), (16, 128, 64)]
for causal in (False, True):
    for heads, head_dim, docs in shapes:
        for run in (RUNS[name] for name in chosen):
            try:
                run(heads, head_dim, docs, causal)
            except Exception as error:  # report and go on: one PyTorch lacks one path or another
                print(f"{run.__name__}: H={heads} D={head_dim} documents={docs} causal={int(causal)} failed: "
                      f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}", flush=True)
