"""Where a Hugging Face training step's time goes, "ringattn" beside "sdpa": torch.profiler's CUDA kernel
totals of one step (after warm-up) of hf_train_step.py's model, one causal sequence, grouped by kernel name.
Usage: PYTHONPATH=build/python python3 bench/hf_step_profile.py [--seq 32768] [--top 14] (and hf_train_step.py's
model options)"""

import torch
from torch.profiler import profile, ProfilerActivity

import ringattn.hf
from hf_train_step import model_of, parser, step_of


def kernel_totals(step):
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    totals = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] = totals.get(e.name, 0.0) + e.device_time / 1e3  # ms
    return totals


def main():
    p = parser()  # hf_train_step.py's model options (its --documents, --iters and --device unused here)
    p.add_argument("--top", type=int, default=14)
    p.set_defaults(seq=32768)
    a = p.parse_args()
    ids = torch.randint(0, 32000, (1, a.seq), device="cuda")
    inputs = dict(input_ids=ids, labels=ids, position_ids=torch.arange(a.seq, device="cuda")[None])
    runs = {}
    for implementation in ("sdpa", ringattn.hf.register()):
        runs[implementation] = totals = kernel_totals(step_of(model_of(a, implementation), inputs))
        print("### %s T=%d: %.2f ms of kernels" % (implementation, a.seq, sum(totals.values())))
        for name, ms in sorted(totals.items(), key=lambda x: -x[1])[:a.top]:
            print("%9.3f ms  %s" % (ms, name[:150]))
    theirs, mine = runs.values()
    print("### kernels whose time differs most (sdpa ms, ringattn ms)")
    names = sorted(set(theirs) | set(mine), key=lambda n: -abs(mine.get(n, 0.0) - theirs.get(n, 0.0)))
    for name in names[:a.top]:
        print("%9.3f %9.3f  %s" % (theirs.get(name, 0.0), mine.get(name, 0.0), name[:150]))


if __name__ == "__main__":
    main()
