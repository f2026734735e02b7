"""Where a packed batch's call through ringattn.torch.attention_varlen spends its time beside the same
attention called with segment ids made once: CUDA-event time per call (median of 10 after 2 warm-up calls),
the host's time of each step (cu_seqlens read and checked, segment ids made), calls in a loop (forward alone,
forward and backward) synchronised after 20 as a training loop runs them, then torch.profiler's table of 5 calls. bf16, B=1, T tokens in N equal documents, H heads, D=128.
Arguments: --seq T --heads H --documents N,... --profile"""
import argparse

import torch

import ringattn.torch as rt
from ringattn import varlen

from bench_common import host_ms, median_ms

parser = argparse.ArgumentParser()
parser.add_argument("--seq", type=int, default=32768)
parser.add_argument("--heads", type=int, default=16)
parser.add_argument("--documents", default="16,64")
parser.add_argument("--profile", action="store_true")
args = parser.parse_args()
T, H, D = args.seq, args.heads, 128


for docs in (int(n) for n in args.documents.split(",")):
    cu = torch.arange(0, T + 1, T // docs, device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    packed = varlen.packed_sequences(cu, cu, T, T)
    ids = packed.segment_ids(q.device)
    for causal in (False, True):
        whole = lambda: rt.attention_varlen(q, k, v, cu, cu, causal=causal)  # noqa: E731
        direct = lambda: rt.attention(q[None], k[None], v[None], segment_ids=ids, kv_segment_ids=ids,  # noqa: E731
                                      causal=causal)
        do = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16)
        print(f"documents={docs} causal={int(causal)} T={T} H={H}: attention_varlen {median_ms(whole, 10, warmup=2):.3f} ms, "
              f"attention with ids made once {median_ms(direct, 10, warmup=2):.3f} ms; host: packed_sequences "
              f"{host_ms(lambda: varlen.packed_sequences(cu, cu, T, T)):.3f} ms, segment_ids "
              f"{host_ms(lambda: packed.segment_ids(q.device)):.3f} ms, attention_varlen "
              f"{host_ms(whole):.3f} ms, attention {host_ms(direct):.3f} ms; forward + backward in a loop (a "
              f"synchronisation after 20): attention_varlen {host_ms(lambda: whole().backward(do)):.3f} ms, attention "
              f"{host_ms(lambda: direct()[0].backward(do)):.3f} ms", flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                rt.attention_varlen(q, k, v, cu, cu)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=18), flush=True)
