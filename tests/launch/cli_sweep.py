#!/usr/bin/env python3
"""Random CLI round trips as a new user makes them: `generate` a file of random shape and options, `run` it
(forward and backward) with random options on 1-4 ranks, then `verify` with the same attention options. A run
refused with exit 2 must name why (a shape that does not divide over a mesh axis, an option cudnn lacks); any
other failure, or a verify that finds a wrong element, is a defect. Seeded, so a failing case reruns alike.

    python3 tests/launch/cli_sweep.py RINGATTN MPIEXEC [--backend cpu|cuda] [--count N] [--seed S]
"""
import argparse
import os
import random
import shlex
import subprocess
import sys
import tempfile


def draw(rnd, backend):
    """One case: generate's arguments, the attention options (run's and verify's), and run's own."""
    on_gpu = backend == "cuda"
    B = rnd.choice([1, 2])
    T = rnd.randint(1, 600 if on_gpu else 90)
    S = T if rnd.random() < 0.5 else rnd.randint(1, 600 if on_gpu else 90)
    Hkv = rnd.choice([1, 2])
    Hq = Hkv * rnd.choice([1, 2, 3, 4])
    D = rnd.choice([64, 128, 96, 256, 40] if on_gpu else [8, 16, 24])
    Dv = D if rnd.random() < 0.7 else rnd.choice([64, 128] if on_gpu else [8, 32])
    dtype = rnd.choice(["f16", "bf16"] if on_gpu else ["f32", "f16", "bf16"])
    gen = ["--batch", B, "--seq", T, "--kv-seq", S, "--heads", Hq, "--kv-heads", Hkv, "--head-dim", D,
           "--v-head-dim", Dv, "--dtype", dtype, "--with-grad"]
    for flag, chance in (("--with-mask", 0.2), ("--with-bias", 0.2), ("--with-sinks", 0.3), ("--with-lse-grad", 0.25)):
        if rnd.random() < chance:
            gen.append(flag)
    if S == T and rnd.random() < 0.3:
        gen += ["--segments", rnd.randint(1, min(5, T))]  # each document holds a token at least
        if B == 1 and rnd.random() < 0.5:  # as FlashAttention's cumulative lengths
            gen.append("--cu-seqlens")
    attention = []
    if rnd.random() < 0.5:
        attention.append("--causal")
    if rnd.random() < 0.25:
        attention += ["--window", "%d,%d" % (rnd.randint(-1, 40), rnd.randint(-1, 40))]
    if rnd.random() < 0.2:
        attention += ["--softcap", rnd.choice(["5", "30"])]
    if rnd.random() < 0.15:
        attention += ["--scale", "0.3"]
    if rnd.random() < 0.15:
        attention += ["--dropout", "0.2", "--dropout-seed", str(rnd.randint(0, 99))]
    ranks = rnd.choice([1, 2, 3, 4] if not on_gpu else [1, 2, 2, 3, 4])
    local = ["flash_attn2", "sdpa"] + (["cudnn"] if on_gpu else [])
    impl = rnd.choice(["ring", "ring"] + local + ([] if on_gpu else ["blockwise"])) if ranks == 1 else "ring"
    run = ["--impl", impl, "--backend", backend]
    if impl == "ring":
        run += ["--local-impl", rnd.choice(local + ["flash_attn2"])]
        if rnd.random() < 0.5:
            run += ["--layout", rnd.choice(["contiguous", "zigzag", "striped"])]
        if ranks == 4 and rnd.random() < 0.3:
            run += ["--mesh", rnd.choice(["dp=2,sp=2", "tp=2,sp=2", "tp=4"])]
        if not on_gpu and rnd.random() < 0.15:
            run.append("--deterministic")  # (exact sums on the host ring's wire: no --grad-wire beside it)
        elif rnd.random() < 0.2:
            run += ["--grad-wire", "bf16"]
    if rnd.random() < 0.2:
        run.append("--f32-gradients")
    if rnd.random() < 0.3:  # another tensor format, read and written so (drawn last: earlier draws unchanged)
        fmt = rnd.choice(["bhsd", "sbhd"] + (["thd"] if B == 1 else []))
        gen += ["--qkv-format", fmt]
        attention += ["--qkv-format", fmt]
    return [str(x) for x in gen], attention, ranks, run


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ringattn")
    parser.add_argument("mpiexec")
    parser.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    rnd = random.Random(args.seed)
    defects = refused = verified = 0
    with tempfile.TemporaryDirectory() as work:
        for case in range(args.count):
            gen, attention, ranks, run = draw(rnd, args.backend)
            data, out = os.path.join(work, "in%d.h5" % case), os.path.join(work, "out%d.h5" % case)
            mpi = [args.mpiexec, "--oversubscribe", "-np", str(ranks)]
            steps = [("generate", [args.ringattn, "generate", "--output", data, "--seed", str(case)] + gen),
                     ("run", mpi + [args.ringattn, "run", "--input", data, "--output", out, "--quiet", "--backward"] +
                      attention + run),
                     ("verify", mpi + [args.ringattn, "verify", "--input", data, "--output", out] + attention)]
            for name, command in steps:
                done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
                text = done.stdout + done.stderr
                if name == "run" and done.returncode == 2 and "ringattn: error:" in text:
                    refused += 1
                    reason = [line for line in text.splitlines() if "error:" in line][0].split("error: ", 1)[1]
                    print("refused  %d: %s | %s" % (case, shlex.join(command[4:]), reason[:160]))
                    break
                if done.returncode != 0:
                    defects += 1
                    print("DEFECT   %d: %s exit %d: %s" % (case, name, done.returncode, shlex.join(command)))
                    print("\n".join(line for line in text.splitlines() if line.strip())[-1500:])
                    break
                if name == "verify":
                    verified += 1
                    print("verified %d: %s" % (case, shlex.join(gen + attention + run + ["-np", str(ranks)])))
            for path in (data, out):
                if os.path.exists(path):
                    os.remove(path)
    print("cli_sweep: %d verified, %d refused by name, %d defects" % (verified, refused, defects))
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
