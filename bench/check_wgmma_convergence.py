#!/usr/bin/env python3
"""Finds wgmma that a warp may issue diverged, in the SASS of built objects or programs.

wgmma (HGMMA in SASS) must be issued by a converged warp; issued by a diverged one it stops the kernel with
an illegal instruction. ptxas brackets code a warp may run diverged between BSSY (a convergence barrier's
start, naming the address where its BSYNC waits) and that address: an HGMMA after a branch on a predicate
derived from the thread's index, inside the branch's innermost bracket, is one the warp may issue diverged. The forward's carry instances had one (thread 0's TMA issue left apart
from its warp until the kernel's end); `wgmma::by_thread_zero` reconverges the warp after such blocks.

  python3 bench/check_wgmma_convergence.py build-dev/attention/libra_attention.a [more objects]
cuobjdump comes from $CUOBJDUMP, else PATH, else /usr/local/cuda/bin. Exit 1 when any kernel has one.
"""
import os
import re
import shutil
import subprocess
import sys


def cuobjdump():
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not os.path.exists(tool):
        sys.exit("error: no cuobjdump (set CUOBJDUMP, or put the CUDA toolkit's bin on PATH)")
    return tool


def kernels(sass):
    """(name, [(address, instruction)]) per function of cuobjdump's SASS listing."""
    found = []
    for line in sass.splitlines():
        if "Function :" in line:
            found.append((line.split("Function :")[1].strip(), []))
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and found:
            found[-1][1].append((int(m.group(1), 16), m.group(2)))
    return found


REGISTER = re.compile(r"\b(R\d+|P\d)(\.64|\.128)?\b")


def registers(operand):
    """The registers an operand names (a .64 / .128 pair or quad counts all of its registers)."""
    found = []
    for name, width in REGISTER.findall(operand):
        found.append(name)
        if name.startswith("R") and width:
            found += [f"R{int(name[1:]) + k}" for k in range(1, {".64": 2, ".128": 4}[width])]
    return found


def wide_result(opcode):
    """The width suffix of an instruction whose result fills a register pair or quad, which its listing names by
    the first register alone (LDC.64 R2 writes R2 and R3; IMAD.WIDE R4 and F2I.U64 R4 write R4 and R5)."""
    m = re.search(r"\.(64|128)\b", opcode)
    if m:
        return "." + m.group(1)
    wide = opcode.startswith("IMAD.WIDE") or (opcode.startswith("F2I") and re.search(r"\.[US]64\b", opcode))
    return ".64" if wide else ""


TARGET = re.compile(r"\b0x([0-9a-f]+)\b")


def joins(instructions):
    """The addresses control may reach other than from the instruction before: the targets of branches, calls
    and convergence barriers."""
    found = set()
    for _, text in instructions:
        body = text.partition(" ")[2] if text.startswith("@") else text
        if body.startswith(("BRA", "BRX", "BSSY", "CALL", "JMP")):
            found.update(int(target, 16) for target in TARGET.findall(body))
    return found


def split_branches(instructions):
    """The addresses of the branches on a predicate whose value may differ between the threads of a warp:
    one derived from the thread's index (S2R SR_TID / SR_LANEID), followed through registers in address order,
    twice round (for loops). Constants, uniform registers, what is computed from them alone, and an mbarrier's
    phase test (it reads the barrier once for the whole warp) are alike for the warp. A register written under a
    guard from values alike for the warp keeps, for a read under the same guard, that write's value: where the
    guard holds both ran (ptxas pairs such guarded instructions; no write to the guard, no join between them)."""
    tainted, split, joined = set(), set(), joins(instructions)
    for _ in range(2):
        under = {}  # register -> the guard of its last write, clean, since the last join
        for at, text in instructions:
            if at in joined:
                under.clear()
            guard, _, body = text.partition(" ") if text.startswith("@") else ("", "", text)
            opcode, _, rest = body.partition(" ")
            if opcode.startswith("BRA") and not opcode.startswith("BRA.U") and guard:
                if registers(guard)[0] in tainted:
                    split.add(at)
                continue
            operands = [o.strip() for o in rest.split(",")]
            if not operands[0] or operands[0].startswith("["):
                continue  # a store, an atomic without result, a barrier: no register written
            dests = 2 if re.match(r"[A-Z0-9]*SETP|PLOP3|FCHK", opcode) else 1
            if re.match(r"(IADD3|LEA)\b", opcode):  # carry-outs: the predicates right after the result
                while dests < len(operands) and re.fullmatch(r"P\d", operands[dests]):
                    dests += 1
            written = [r for o in operands[:dests] for r in registers(o + wide_result(opcode))]
            sources = [r for o in operands[dests:] for r in registers(o) if not (guard and under.get(r) == guard)]
            sources += registers(guard)
            thread_index = opcode == "S2R" and re.search(r"SR_(TID|LANEID)", rest)
            if not opcode.startswith("SYNCS.PHASECHK") and (thread_index or any(r in tainted for r in sources)):
                tainted.update(written)
                clean = False
            elif not guard:
                tainted.difference_update(written)  # overwritten with a value alike for the warp
                clean = False
            else:  # where the guard fails the old value (and its taint) stays; reads under this guard see the new one
                clean = not any(r in registers(guard) for r in written)  # unless the guard itself is rewritten
            for r in written:
                under.pop(r, None)
                for other in [o for o, g in under.items() if r in registers(g)]:
                    del under[other]  # the guard changed
                if clean:
                    under[r] = guard
    return split


def diverged_wgmma(instructions):
    """(branch, end, count) for each branch on a per-thread predicate (split_branches) whose innermost convergence
    bracket holds HGMMA after it: the warp reconverges only at that bracket's BSYNC, past those HGMMA."""
    wgmma = [at for at, text in instructions if text.startswith("HGMMA")]
    brackets = []
    for at, text in instructions:
        m = re.match(r"BSSY B\d+, 0x([0-9a-f]+)", text)
        if m:
            brackets.append((at, int(m.group(1), 16)))
    found = []
    for at in sorted(split_branches(instructions)):
        around = [(start, end) for start, end in brackets if start < at < end]
        if not around:
            continue
        end = min(around, key=lambda bracket: bracket[1] - bracket[0])[1]
        inside = sum(1 for w in wgmma if at < w < end)
        if inside:
            found.append((at, end, inside))
    return found


def main(paths):
    if not paths:
        sys.exit(__doc__)
    tool, bad, checked = cuobjdump(), 0, 0
    for path in paths:
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True).stdout
        for name, instructions in kernels(sass):
            if not any(text.startswith("HGMMA") for _, text in instructions):
                continue
            checked += 1
            for start, end, inside in diverged_wgmma(instructions):
                bad += 1
                print(f"{path}: {name}: {inside} HGMMA between a branch at {start:#x} and the BSYNC at {end:#x}")
    print(f"{checked} kernels with wgmma checked, {bad} brackets with wgmma a warp may issue diverged")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
