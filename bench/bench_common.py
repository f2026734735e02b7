"""What the Python bench scripts share: CUDA-event timing and the attention shape's arguments."""

import statistics
import time

import torch


def add_shape_arguments(parser, seq=32768):
    """--seq, --heads, --head-dim (bf16, B=1, the device README's shape by default) and --causal 0 | 1."""
    parser.add_argument("--seq", type=int, default=seq)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", type=int, default=1)


def median_ms(fn, iters, barrier=lambda: None, warmup=1):
    """The median of `iters` calls of `fn`, each after `barrier()` (the ranks start together), after `warmup`
    untimed calls, in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_ms(fn, calls=20):
    """Wall milliseconds per call of `fn` over `calls` calls, the host synchronised only at the end (after one
    untimed call, which loads the kernels lazily and fills the caches): the host's time where it exceeds the
    device's."""
    fn()
    torch.cuda.synchronize()
    wall = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - wall) * 1e3 / calls
