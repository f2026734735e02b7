"""A rank that fails leaves no other rank hanging (run by CTest on 2 ranks, not under pytest: the ranks
take different paths).

Default: rank 1 passes a shard of the wrong length (or, with --bad-bias, a bias of int32) and
raises ValueError at once; rank 0 learns of it at the call's start and raises too, quoting rank 1's
reason, long before the timeout. --late: rank 1 calls only after rank 0's timeout has passed; rank 0
raises within about the timeout, naming the agreement that rank 1 did not join."""

import sys
import time

import numpy as np
from mpi4py import MPI

import ringattn

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
mode = sys.argv[1] if len(sys.argv) > 1 else "--short-shard"
rng = np.random.default_rng(rank)
rows = 5 if rank == 1 and mode == "--short-shard" else 8  # a short shard: 3 rows short of the layout's 8
q = rng.standard_normal((1, rows, 2, 16)).astype(np.float32)
bias_dtype = np.int32 if rank == 1 else np.float32
options = {"bias": np.zeros((1, 1, 8, 16), bias_dtype)} if mode == "--bad-bias" else {}
timeout = 2.0 if mode == "--late" else 30.0
if rank == 1 and mode == "--late":
    time.sleep(3 * timeout)
start = time.monotonic()
try:
    ringattn.ring_attention(q, q[:, :, :1], q[:, :, :1], comm=comm, layout="contiguous", global_q_len=16,
                            global_kv_len=16, timeout=timeout, **options)
    print(f"rank {rank}: no error raised", flush=True)
    sys.exit(1)
except ValueError as e:
    took = time.monotonic() - start
    print(f"rank {rank}: ValueError after {took:.1f} s: {e}", flush=True)
    if mode == "--late":
        named = rank == 1 or "an agreement of the ranks before the ring: not every one of the 2 ranks joined" in str(e)
        sys.exit(0 if took < 5 * timeout and named else 1)
    reason = "rows (dimension 1) on rank 1" if mode == "--short-shard" else "bias has dtype i32, expected f32"
    named = reason in str(e) and (rank == 1 or "rank 1 of 2 refused its part of the call" in str(e))
    sys.exit(0 if took < timeout / 3 and named else 1)
