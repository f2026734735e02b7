"""What one small attention call costs through ringattn.torch on a GPU, per implementation: wall time per
call (host, synchronised at the end of N calls) and device time (CUDA events), forward and backward, for a
(1, T, H, D) bf16 block; where the host's time per call far exceeds the device's, the call's own overhead
dominates (as a varlen batch of many short documents run a call each meets it).
Arguments: --seqs T,... --heads H --head-dim D --calls N --impls a,b (torch_sdpa: PyTorch's SDPA, for reference)"""
import argparse
import time

import torch
import torch.nn.functional as F

import ringattn.torch as rt

parser = argparse.ArgumentParser()
parser.add_argument("--seqs", default="128,512,2048")
parser.add_argument("--heads", type=int, default=16)
parser.add_argument("--head-dim", type=int, default=128)
parser.add_argument("--calls", type=int, default=50)
parser.add_argument("--impls", default="flash_attn2,cudnn")
parser.add_argument("--profile", action="store_true", help="then torch.profiler's table of 10 calls at the first T")
args = parser.parse_args()


def per_call_ms(fn, calls):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return (time.perf_counter() - wall) * 1e3 / calls, start.elapsed_time(end) / calls


for T in (int(t) for t in args.seqs.split(",")):
    q, k, v = (torch.randn(1, T, args.heads, args.head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    for impl in args.impls.split(","):
        for causal in (False, True):
            call = (lambda: rt.attention(q, k, v, causal=causal, impl=impl)) if impl != "torch_sdpa" else (
                lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       is_causal=causal).transpose(1, 2))
            fwd = per_call_ms(call, args.calls)
            o = call()
            do = torch.randn_like(o)
            bwd = per_call_ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), args.calls)
            print(f"T={T:6d} H={args.heads} D={args.head_dim} {impl:12s} causal={int(causal)} "
                  f"forward host {fwd[0]:7.3f} ms device {fwd[1]:7.3f} ms; backward host {bwd[0]:7.3f} ms "
                  f"device {bwd[1]:7.3f} ms", flush=True)

if args.profile:
    from torch.profiler import ProfilerActivity, profile

    T = int(args.seqs.split(",")[0])
    q, k, v = (torch.randn(1, T, args.heads, args.head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    for impl in (name for name in args.impls.split(",") if name != "torch_sdpa"):
        o = rt.attention(q, k, v, impl=impl)
        do = torch.randn_like(o)
        torch.autograd.grad(rt.attention(q, k, v, impl=impl), (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            torch.cuda.synchronize()
        print(f"--- {impl}, T={T}: 10 backward calls")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
