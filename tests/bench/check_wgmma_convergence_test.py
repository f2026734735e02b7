"""bench/check_wgmma_convergence.py on SASS excerpts shaped as cuobjdump prints them (no GPU, no cuobjdump):
the forward's carry instance that failed (thread 0's block reconverging only at the kernel's end) is named,
and the forms the committed kernels use are not (reconverged blocks, an mbarrier's retry branch, a branch on
a kernel parameter)."""
import importlib.util
import pathlib

spec = importlib.util.spec_from_file_location(
    "check_wgmma_convergence", pathlib.Path(__file__).resolve().parents[2] / "bench" / "check_wgmma_convergence.py")
checker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checker)


def listing(name, body):
    """A cuobjdump -sass function of `body`'s instructions, one per line, at addresses 0x10 apart."""
    lines = [f"\t\tFunction : {name}"]
    for i, text in enumerate(body.strip().splitlines()):
        lines.append(f"        /*{16 * i:04x}*/                   {text.strip()} ;  /* 0x0000000000007945 */")
        lines.append("                                                 /* 0x000fe20003800000 */")
    return "\n".join(lines)


def diverged(body):
    [(_, instructions)] = checker.kernels(listing("kernel", body))
    return checker.diverged_wgmma(instructions)


def branch_over_wgmma(before, test):
    """`before`, then a bracket that opens, runs `test` (which sets P3) and branches on P3 to its BSYNC over one
    wgmma."""
    bsync = 16 * (len(before) + len(test) + 4)
    return "\n".join(before + [f"BSSY B0, {bsync:#x}"] + test + [f"@P3 BRA {bsync:#x}", "WARPGROUP.ARRIVE",
                      "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT", "BSYNC B0", "EXIT"])


# Thread 0 initialises the mbarriers and starts the first load; its bracket closes after the last wgmma
# (addresses: BSSY at 0x10 names 0x90, the BSYNC).
THREAD_ZERO_APART = """
S2R R10, SR_TID.X
BSSY B0, 0x90
ISETP.NE.AND P0, PT, R10, RZ, PT
@P0 BRA 0x60
SYNCS.EXCH.64 URZ, [UR9], UR10
UTMALDG.4D [UR8], [UR18]
BAR.SYNC.DEFER_BLOCKING 0x0
WARPGROUP.ARRIVE
HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT
BSYNC B0
EXIT
"""

# The same block reconverged where it ends (BSSY at 0x10 names 0x60).
THREAD_ZERO_RECONVERGED = """
S2R R10, SR_TID.X
BSSY B0, 0x60
ISETP.NE.AND P0, PT, R10, RZ, PT
@P0 BRA 0x60
SYNCS.EXCH.64 URZ, [UR9], UR10
UTMALDG.4D [UR8], [UR18]
BSYNC B0
WARPSYNC.ALL
BAR.SYNC.DEFER_BLOCKING 0x0
WARPGROUP.ARRIVE
HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT
EXIT
"""

# A step's wait on its mbarrier, the retry out of line, inside the bracket of the step loop.
PHASE_WAIT = """
S2R R10, SR_TID.X
BSSY B0, 0x90
LEA R17, R10, UR8, 0x3
SHF.L.U32 R12, R12, 0x1f, RZ
SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [R17+URZ], R12
@!P2 BRA 0xa0
WARPGROUP.ARRIVE
HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT
WARPGROUP.DEPBAR.LE gsb0, 0x0
BSYNC B0
EXIT
"""

# A branch on a kernel parameter (the soft cap's `> 0`), alike for every thread.
PARAMETER_BRANCH = """
S2R R10, SR_TID.X
LDC R16, c[0x0][0x418]
BSSY B0, 0x90
FSETP.GT.AND P2, PT, R16, RZ, PT
@!P2 BRA 0x60
MUFU.RCP R248, R16
WARPGROUP.ARRIVE
HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT
WARPGROUP.DEPBAR.LE gsb0, 0x0
BSYNC B0
EXIT
"""


def test_names_thread_zero_kept_apart_until_after_wgmma():
    assert diverged(THREAD_ZERO_APART) == [(0x30, 0x90, 1)]


def test_passes_a_block_reconverged_before_wgmma():
    assert diverged(THREAD_ZERO_RECONVERGED) == []


def test_passes_an_mbarrier_wait_and_a_parameter_branch():
    assert diverged(PHASE_WAIT) == []
    assert diverged(PARAMETER_BRANCH) == []


def test_a_register_overwritten_from_a_constant_is_alike_again():
    # R10 held the thread's index, then a parameter: the branch on it is alike for the warp.
    body = PARAMETER_BRANCH.replace("LDC R16, c[0x0][0x418]", "LDC R10, c[0x0][0x418]").replace("R16, RZ", "R10, RZ")
    assert diverged(body) == []
    # Left derived from the thread's index, it is not.
    body = PARAMETER_BRANCH.replace("R16, RZ, PT", "R10, RZ, PT")
    assert diverged(body) == [(0x40, 0x90, 1)]


def test_a_register_pair_loaded_whole_is_alike_again():
    # R2 and R3 held values derived from the thread's index; LDC.64 R2 overwrites both with a parameter
    # (the backward's `k_run != kNotARun`, a 64-bit test on the pair): the branch on it is alike for the warp.
    body = branch_over_wgmma(["S2R R2, SR_TID.X", "IMAD.MOV.U32 R3, RZ, RZ, R2", "LDC.64 R2, c[0x0][0x3f8]"],
                             ["ISETP.NE.U32.AND P3, PT, R2, RZ, PT", "ISETP.NE.AND.EX P3, PT, R3, -0x80000000, PT, P3"])
    assert diverged(body) == []
    # A 64-bit load through a per-thread address leaves the whole pair per-thread.
    assert diverged(body.replace("LDC.64 R2, c[0x0][0x3f8]", "LDG.E.64 R2, desc[UR14][R2.64]")) == [(0x60, 0x90, 1)]


def test_a_pair_converted_whole_is_alike_again():
    # R3 held a value derived from the thread's index; F2I.U64 R2 writes R2 and R3 from a parameter (dropout's
    # threshold formed from p in the backward, 2^32 p rounded): a branch on its high half is alike for the warp.
    body = branch_over_wgmma(["S2R R3, SR_TID.X", "LDC R16, c[0x0][0x46c]"],
                             ["FMUL R16, R16, 4.29496729600000000000e+09", "F2I.U64.TRUNC R2, R16",
                              "ISETP.NE.AND P3, PT, R3, RZ, PT"])
    assert diverged(body) == []
    # A 32-bit result leaves R3 per-thread.
    assert diverged(body.replace("F2I.U64.TRUNC", "F2I.U32.TRUNC")) == [(0x60, 0x90, 1)]


def test_a_carry_out_is_written():
    # P5 held a per-thread test; IADD3 R2, P5, ... writes its carry into P5 (the threshold's rounding), which IMAD.X
    # adds into the high half: the branch on that half is alike for the warp.
    body = branch_over_wgmma(["S2R R10, SR_TID.X", "ISETP.GE.AND P5, PT, R10, RZ, PT", "LDC R2, c[0x0][0x46c]",
                              "LDC R3, c[0x0][0x470]"],
                             ["IADD3 R2, P5, R2, 0x8000, RZ", "IMAD.X R3, RZ, RZ, R3, P5", "ISETP.NE.AND P3, PT, R3, RZ, PT"])
    assert diverged(body) == []
    # The carry into another predicate leaves P5 per-thread, and the high half with it.
    assert diverged(body.replace("IADD3 R2, P5", "IADD3 R2, P4")) == [(0x80, 0xb0, 1)]


# The backward walk's `hides` test as ptxas paired it: P5 held a per-thread value from the last trip round the
# loop, is written again under @!P4 (a parameter's test) and read at once under the same guard, so where that
# read runs P5 holds the new value, alike for the warp (BSSY at 0x10 names 0xb0).
GUARDED_PAIR = """
S2R R10, SR_TID.X
BSSY B0, 0xb0
ISETP.GE.AND P5, PT, R10, RZ, PT
LDC R16, c[0x0][0x418]
PLOP3.LUT P2, PT, PT, PT, PT, 0x80, 0x0
ISETP.NE.AND P4, PT, R16, RZ, PT
@!P4 ISETP.GT.AND P5, PT, R16, -0x1, PT
@!P4 ISETP.GT.AND P2, PT, R16, RZ, P5
@!P2 BRA 0xb0
WARPGROUP.ARRIVE
HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT
BSYNC B0
EXIT
"""


def test_a_write_and_a_read_under_one_guard_pair_up():
    assert diverged(GUARDED_PAIR) == []
    # Control joining between them (a branch to the read) may bring P5's per-thread value: named.
    joined = GUARDED_PAIR.replace("BSSY B0, 0xb0", "BSSY B0, 0xc0").replace("@!P2 BRA 0xb0", "@!P2 BRA 0xc0").replace(
        "@!P4 ISETP.GT.AND P5, PT, R16, -0x1, PT\n", "@!P4 ISETP.GT.AND P5, PT, R16, -0x1, PT\n@P4 BRA 0x80\n")
    assert diverged(joined) == [(0x90, 0xc0, 1)]
    # The guard rewritten between them: the read's guard is no longer the write's.
    rewritten = joined.replace("@P4 BRA 0x80", "ISETP.NE.AND P4, PT, R16, 0x1, PT")
    assert diverged(rewritten) == [(0x90, 0xc0, 1)]
    # Without the pairing rule (the write under another guard) the per-thread P5 reaches the branch.
    assert diverged(GUARDED_PAIR.replace("@!P4 ISETP.GT.AND P5", "@P4 ISETP.GT.AND P5")) == [(0x80, 0xb0, 1)]
