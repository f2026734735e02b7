"""Where the GPU ring's backward spends device time (issue 21's overhead hunt): torch.profiler (CUPTI sees
every kernel, copy and runtime call of the process, ringattn's too) over one forward + backward of
ringattn.torch.ring_attention under mpirun, one GPU per rank. Prints, per rank, the backward's device
activity in time order (stream, start and length in microseconds from the backward's first activity,
name) and the runtime calls that block the host (synchronisations, frees, allocations).

Usage: mpirun -np 2 python3 bench/torch_profile_ring.py [--seq 32768] [--causal 1] [--local-impl cudnn]
"""

import argparse
import json
import os
import tempfile

import torch
from mpi4py import MPI
from torch.profiler import ProfilerActivity, profile, record_function

import ringattn
import ringattn.torch as rt
from bench_common import add_shape_arguments

BLOCKING = ("cudaFree", "cudaMalloc", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
            "cudaMemcpy ", "cudaMemcpy(", "cudaHostAlloc", "cudaMallocHost", "cudaFreeHost", "cudaIpc")


def main():
    parser = argparse.ArgumentParser()
    add_shape_arguments(parser)
    parser.add_argument("--local-impl", default="cudnn")
    parser.add_argument("--min-us", type=float, default=20.0, help="leave out device activities shorter than this")
    a = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    layout = "zigzag" if a.causal else "contiguous"
    g = torch.Generator(device="cuda").manual_seed(rank)
    q, k, v, do = (ringattn.shard(torch.randn(1, a.seq, a.heads, a.head_dim, device="cuda", dtype=torch.bfloat16,
                                              generator=g), 1, layout, rank, size).contiguous() for _ in range(4))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]

    def step():
        o = rt.ring_attention(*leaves, comm=comm, causal=bool(a.causal), layout=layout, local_impl=a.local_impl)
        torch.cuda.synchronize()
        comm.Barrier()
        with record_function("ring_backward"):
            o.backward(do)
            torch.cuda.synchronize()

    for _ in range(3):
        step()
    comm.Barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    marks = [e for e in events if e.get("name") == "ring_backward" and e.get("ph") == "X"]
    lo, hi = marks[0]["ts"], marks[0]["ts"] + marks[0]["dur"]
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and lo <= e["ts"] <= hi]
    runtime = [e for e in events if e.get("cat") == "cuda_runtime" and lo <= e["ts"] <= hi
               and e["name"].startswith(BLOCKING)]
    origin = min(e["ts"] for e in device) if device else lo
    lines = [f"rank {rank}: {a.local_impl} T={a.seq} causal={a.causal} {layout}, backward host span "
             f"{(hi - lo) / 1e3:.3f} ms, device span {(max(e['ts'] + e['dur'] for e in device) - origin) / 1e3:.3f} ms"]
    busy = {}
    for e in device:
        busy[e["args"].get("stream", e["tid"])] = busy.get(e["args"].get("stream", e["tid"]), 0) + e["dur"]
    lines.append("  device busy by stream (ms): " + ", ".join(f"{s}: {t / 1e3:.3f}" for s, t in sorted(busy.items())))
    for e in sorted(device + runtime, key=lambda e: e["ts"]):
        if e.get("cat") != "cuda_runtime" and e["dur"] < a.min_us:
            continue
        where = "host" if e.get("cat") == "cuda_runtime" else f"s{e['args'].get('stream', e['tid'])}"
        lines.append(f"  {where:>5s} {e['ts'] - origin:10.1f} {e['dur']:9.1f}  {e['name'][:90]}")
    for r in range(size):
        if r == rank:
            print("\n".join(lines), flush=True)
        comm.Barrier()


if __name__ == "__main__":
    main()
