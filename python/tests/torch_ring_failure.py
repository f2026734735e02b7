"""Under torchrun a rank that stalls leaves no other rank hanging (run by CTest on 2 ranks, not under
pytest: the ranks take different paths). Rank 1 never calls the ring; rank 0 raises ValueError within
about `timeout` at the call's first collective, the all_reduce that agrees that no rank refused its
arguments and compares the ranks' options, with the global lengths given or summed over the ranks after it
(each in a fresh process group: a timed-out gloo group cannot be used again)."""

import sys
import time

import torch
import torch.distributed as dist

import ringattn.torch as rt

lengths = {"global_q_len": 16, "global_kv_len": 16} if sys.argv[1:] == ["--lengths"] else {}
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1:
    time.sleep(8)
    sys.exit(0)
q = torch.randn(1, 8, 2, 16)
start = time.monotonic()
try:
    rt.ring_attention(q, q[:, :, :1], q[:, :, :1], layout="contiguous", timeout=3.0, **lengths)
    print(f"rank {rank}: no error raised", flush=True)
    sys.exit(1)
except ValueError as e:
    took = time.monotonic() - start
    print(f"rank {rank}: ValueError after {took:.1f} s: {str(e)[:200]}", flush=True)
    named = "all_reduce" in str(e) and "did every rank call the ring?" in str(e)
    sys.exit(0 if took < 15 and named else 1)
