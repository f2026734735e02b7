#!/usr/bin/env bash
# `ringattn run --backward` end to end (issue 20): generate --with-grad -> run --backward -> verify of
# o, lse, dq, dk, dv and dbias against the f64 oracle, for every CPU implementation and the host ring on
# 2-4 ranks; a corrupted
# gradient must fail verify; bad use exits 2 on every rank naming the cause, leaving no output.
# Usage: backward_cli_test.sh RINGATTN MPIEXEC
set -u
ra=$1; mpiexec=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMPI_MCA_orte_base_help_aggregate=0
python=/usr/bin/python3; [ -x $python ] || python=python3
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
cd "$dir"
fails=0; passes=0
# expect NAME WANT_CODE PATTERN command...: the exit code and a line of the output matching PATTERN.
expect() {
  local name=$1 want=$2 pattern=$3; shift 3
  local out code
  out=$(timeout 120 "$@" 2>&1); code=$?
  if [ "$code" -eq "$want" ] && grep -q -- "$pattern" <<<"$out"; then passes=$((passes+1)); echo "ok   $name"
  else fails=$((fails+1)); echo "FAIL $name (exit $code, wanted $want; pattern '$pattern')"; echo "$out" | tail -6; fi
}
no_output() {
  if [ -e "$2" ] || [ -e "$2.partial" ]; then fails=$((fails+1)); echo "FAIL $1: output $2 left behind"; else passes=$((passes+1)); echo "ok   $1"; fi
}

"$ra" generate --output bf16.h5 --seq 77 --kv-seq 90 --heads 4 --kv-heads 2 --head-dim 32 --v-head-dim 24 --dtype bf16 \
  --with-bias --with-mask --with-grad --seed 3 >/dev/null
"$ra" generate --output f32.h5 --batch 2 --seq 45 --heads 8 --kv-heads 1 --head-dim 64 --segments 3 --with-grad \
  --seed 4 >/dev/null
"$ra" generate --output nograd.h5 --seq 16 --heads 2 --head-dim 16 >/dev/null
for impl in sdpa flash_attn2 blockwise; do
  for input in bf16 f32; do
    opts="--causal"; [ $input = f32 ] && opts="--window 9,3 --softcap 20"
    expect "run --backward $impl $input" 0 "backward" "$ra" run --input $input.h5 --output $impl-$input.h5 --impl $impl \
      $opts --backward --quiet
    expect "verify $impl $input (dq, dk, dv)" 0 "dv vs f64 reference.*#wrong 0  OK" "$ra" verify --input $input.h5 \
      --output $impl-$input.h5 $opts
  done
done
expect "run --backward --f32-gradients" 0 "backward" "$ra" run --input bf16.h5 --output f32grad.h5 --causal --backward \
  --f32-gradients --quiet
expect "f32 gradients verify" 0 "dq vs f64 reference.*OK" "$ra" verify --input bf16.h5 --output f32grad.h5 --causal
# On two ranks sharding the batch (dp=2): each rank's slice of the gradients.
expect "dp=2 run --backward" 0 "backward" "$mpiexec" --oversubscribe -np 2 "$ra" run --input f32.h5 --output dp2.h5 \
  --mesh dp=2 --backward --quiet
expect "dp=2 verify" 0 "dk vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe -np 2 "$ra" verify \
  --input f32.h5 --output dp2.h5 --mesh dp=2
# Gradients zero by cancellation (one key; a constant V; a constant K), f32: verify weighs them by the rounding of
# their terms, not of the zero they sum to (it failed such files); on 1 and 3 ranks, and a changed dk still fails.
$python - <<'PY'
import h5py, numpy as np
rng = np.random.default_rng(5)
def write(name, t, s, constant_v=False, constant_k=False):
    q, k, v = rng.standard_normal((1, t, 4, 32)), rng.standard_normal((1, s, 2, 32)), rng.standard_normal((1, s, 2, 24))
    if constant_v: v[:] = v[:, :1]
    if constant_k: k[:] = k[:, :1]
    with h5py.File(name, "w") as f:
        for n, a in (("q", q), ("k", k), ("v", v), ("do", rng.standard_normal((1, t, 4, 24)))):
            f[n] = a.astype(np.float32)
write("one-key.h5", 16, 1)
write("constant-v.h5", 40, 40, constant_v=True)
write("constant-k.h5", 40, 40, constant_k=True)
PY
for input in one-key constant-v constant-k; do
  for n in 1 3; do
    expect "run --backward $input, $n ranks" 0 "backward" "$mpiexec" --oversubscribe -np $n "$ra" run --input $input.h5 \
      --output $input-$n.h5 --backward --quiet
    expect "verify $input, $n ranks (terms that cancel)" 0 "dk vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe \
      -np $n "$ra" verify --input $input.h5 --output $input-$n.h5
  done
done
$python - <<'PY'
import h5py
with h5py.File("one-key-1.h5", "r+") as f:
    f["dk"][0, 0, 1, 3] += 0.01
PY
expect "verify catches a changed dk of zero" 1 "dk vs f64 reference.*#wrong 1  FAILED" "$ra" verify --input one-key.h5 \
  --output one-key-1.h5
# Large logits (activations 30x a unit normal's: logits of about 1e4): f32 rounds each by about 1e-3, which moves
# P, O, LSE and the gradients however exact the kernel; verify allows for it (it failed such files) and stays tight
# for unit-scale inputs.
$python - <<'PY'
import h5py, numpy as np
rng = np.random.default_rng(6)
with h5py.File("large-logits.h5", "w") as f:
    for n, shape, scale in (("q", (1, 64, 4, 64), 30), ("k", (1, 64, 2, 64), 30), ("v", (1, 64, 2, 64), 1), ("do", (1, 64, 4, 64), 1)):
        f[n] = (rng.standard_normal(shape) * scale).astype(np.float32)
PY
expect "run --backward large logits" 0 "backward" "$mpiexec" --oversubscribe -np 2 "$ra" run --input large-logits.h5 \
  --output large-logits-out.h5 --backward --quiet
expect "verify large logits" 0 "dq vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe -np 2 "$ra" verify \
  --input large-logits.h5 --output large-logits-out.h5
# A wrong gradient fails verify.
$python - <<'PY'
import h5py
with h5py.File("sdpa-f32.h5", "r+") as f:
    f["dk"][0, 5, 0, 3] += 0.05
PY
expect "verify catches a changed dk" 1 "dk vs f64 reference.*#wrong 1  FAILED" "$ra" verify --input f32.h5 \
  --output sdpa-f32.h5 --window 9,3 --softcap 20
# Bad use: exit 2, the cause named, no output.
expect "no do dataset" 2 "has no dataset 'do'" "$ra" run --input nograd.h5 --output x.h5 --backward
no_output "no do dataset: no output" x.h5
expect "--f32-gradients without --backward" 2 "add --backward" "$ra" run --input bf16.h5 --output x.h5 --f32-gradients
expect "--do-dataset without --backward" 2 "add --backward" "$ra" run --input bf16.h5 --output x.h5 --do-dataset g
expect "--do-dataset missing" 2 "has no dataset 'g'" "$ra" run --input bf16.h5 --output x.h5 --backward --do-dataset g
expect "do of the wrong shape" 2 "dimension 3 (v_head_dim) is 32, expected 24" "$ra" run --input bf16.h5 --output x.h5 \
  --backward --do-dataset q
expect "a local implementation on a split sequence refused" 2 "needs --impl ring" "$mpiexec" --oversubscribe -np 2 "$ra" \
  run --input f32.h5 --output x.h5 --backward --impl flash_attn2
no_output "refusals leave no output" x.h5
# A loss that reads lse too: dLoss/dlse (B, Hq, T) float32 beside do, read where present (or named), on 1 and 3 ranks
# (zigzag, causal, a window, GQA); verify uses it, so outputs computed without it fail; bad ones refused by name.
$python - <<'PY'
import h5py, numpy as np
rng = np.random.default_rng(8)
r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
q, k, v, do, dlse = r(2, 45, 4, 16), r(2, 45, 2, 16), r(2, 45, 2, 16), r(2, 45, 4, 16), r(2, 4, 45)
for name, extra in (("dlse.h5", {"dlse": dlse}), ("dlse-none.h5", {}), ("dlse-named.h5", {"grads/lse": dlse}),
                    ("dlse-wrong.h5", {"dlse": r(2, 45, 4)})):
    with h5py.File(name, "w") as f:
        for n, a in dict(q=q, k=k, v=v, do=do, **extra).items():
            f[n] = a
PY
expect "dlse: run --backward" 0 "backward" "$ra" run --input dlse.h5 --output dlse-1.h5 --backward --quiet
expect "dlse: verify" 0 "dk vs f64 reference.*#wrong 0  OK" "$ra" verify --input dlse.h5 --output dlse-1.h5
expect "dlse: ring -np 3 run --backward" 0 "backward" "$mpiexec" --oversubscribe -np 3 "$ra" run --input dlse.h5 \
  --output dlse-3.h5 --backward --causal --window 20,-1 --quiet
expect "dlse: ring -np 3 verify" 0 "dq vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe -np 2 "$ra" verify \
  --input dlse.h5 --output dlse-3.h5 --causal --window 20,-1
expect "dlse: a path named" 0 "backward" "$mpiexec" --oversubscribe -np 2 "$ra" run --input dlse-named.h5 \
  --output dlse-named-out.h5 --backward --dlse-dataset grads/lse --quiet
expect "dlse: a path named, verify" 0 "dk vs f64 reference.*#wrong 0  OK" "$ra" verify --input dlse-named.h5 \
  --output dlse-named-out.h5 --dlse-dataset grads/lse
expect "dlse: gradients without it fail" 0 "backward" "$ra" run --input dlse-none.h5 --output dlse-without.h5 --backward \
  --quiet
expect "dlse: verify catches gradients without it" 1 "dk vs f64 reference.*FAILED" "$ra" verify --input dlse.h5 \
  --output dlse-without.h5
expect "dlse of the wrong shape" 2 "dataset 'dlse' of 'dlse-wrong.h5' dimension 1 (q_heads) is 45, expected 4" "$ra" run \
  --input dlse-wrong.h5 --output x.h5 --backward
expect "--dlse-dataset missing" 2 "has no dataset 'grads/x'" "$ra" run --input dlse.h5 --output x.h5 --backward \
  --dlse-dataset grads/x
expect "--dlse-dataset without --backward" 2 "add --backward" "$ra" run --input dlse.h5 --output x.h5 --dlse-dataset d
no_output "dlse refusals leave no output" x.h5
# The host ring's backward (issue 21) on 2, 3 and 4 ranks, every layout, uneven shards (T = 45 and 61).
"$ra" generate --output ring.h5 --batch 2 --seq 61 --heads 4 --kv-heads 2 --head-dim 32 --dtype bf16 --segments 2 --with-grad \
  --seed 5 >/dev/null
for n in 2 3 4; do
  for layout in contiguous zigzag striped; do
    for input in ring f32; do
      opts="--causal"; [ $input = f32 ] && opts="--window 9,3 --softcap 20"
      expect "ring -np $n $layout $input run --backward" 0 "backward" "$mpiexec" --oversubscribe -np $n "$ra" run \
        --input $input.h5 --output ring-$n-$layout-$input.h5 --layout $layout $opts --backward --quiet
      expect "ring -np $n $layout $input verify" 0 "dv vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe -np $n \
        "$ra" verify --input $input.h5 --output ring-$n-$layout-$input.h5 --layout $layout $opts
    done
  done
done
# Attention sinks from the file: o, lse and dsinks (summed over every query row, over the batch's dp ranks and
# the ring's sp ranks; each tp rank writes its heads) against f64 on every mesh; a changed dsinks is caught;
# a sinks dataset of the wrong length or dtype is refused by name.
"$ra" generate --output sinks.h5 --batch 2 --seq 45 --heads 4 --kv-heads 2 --head-dim 32 --dtype bf16 --with-sinks \
  --with-grad --seed 8 >/dev/null
for mesh in sp=1 sp=3 dp=2,sp=2 tp=2,sp=2; do
  n=$(( $(sed 's/[a-z]*=//g; s/,/*/g' <<<"$mesh") ))
  expect "sinks on $mesh run --backward" 0 "dsinks" "$mpiexec" --oversubscribe -np $n "$ra" run --input sinks.h5 \
    --output sinks-$mesh.h5 --mesh $mesh --causal --backward
  expect "sinks on $mesh verify" 0 "dsinks vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe -np $n "$ra" \
    verify --input sinks.h5 --output sinks-$mesh.h5 --mesh $mesh --causal
done
$python - <<'PY'
import h5py, numpy as np, shutil
with h5py.File("sinks-sp=3.h5", "r+") as f:
    f["dsinks"][2] += 0.01
shutil.copy("sinks.h5", "sinks-short.h5")
with h5py.File("sinks-short.h5", "r+") as f:
    del f["sinks"]
    f["sinks"] = np.zeros(5, np.float32)
PY
expect "verify catches a changed dsinks" 1 "dsinks vs f64 reference.*#wrong 1  FAILED" "$mpiexec" --oversubscribe -np 3 \
  "$ra" verify --input sinks.h5 --output sinks-sp=3.h5 --mesh sp=3 --causal
expect "sinks of the wrong length refused" 2 "dataset 'sinks' of '.*' dimension 0 (q_heads) is 5, expected 4" "$ra" run \
  --input sinks-short.h5 --output x.h5
no_output "the sinks refusal leaves no output" x.h5
# --deterministic: the exact-sum ring's forward and backward give the same bits on 1 to 4 ranks, any layout
# (o, lse, dq, dk, dv, dbias), and pass verify.
for input in f32 bf16; do
  opts="--window 9,3 --softcap 20"; [ $input = bf16 ] && opts="--causal"
  for run in 1:contiguous 2:zigzag 3:striped 4:zigzag; do
    n=${run%%:*}; layout=${run#*:}
    expect "--deterministic -np $n $layout $input run --backward" 0 "backward" "$mpiexec" --oversubscribe -np $n "$ra" run \
      --input $input.h5 --output det-$input-$n.h5 --impl ring --layout $layout $opts --backward --deterministic --quiet
  done
  expect "--deterministic $input verify" 0 "dv vs f64 reference.*#wrong 0  OK" "$ra" verify --input $input.h5 \
    --output det-$input-1.h5 $opts
  expect "--deterministic $input: the same bits on 1, 2, 3 and 4 ranks" 0 "identical" env INPUT=$input $python - <<'PY'
import h5py, numpy as np, os
files = [h5py.File("det-%s-%d.h5" % (os.environ["INPUT"], n), "r") for n in (1, 2, 3, 4)]
names = [n for n in ("o", "lse", "dq", "dk", "dv", "dbias") if n in files[0]]
bad = [(n, i + 2) for n in names for i, f in enumerate(files[1:])
       if not np.array_equal(files[0][n][...].view(np.uint8), f[n][...].view(np.uint8))]
print("%s: %s" % (" ".join(names), "identical" if not bad else "DIFFERENT %s" % bad))
PY
done
# Non-finite inputs cannot be fixed-point terms: refused by name on every rank (exit 2, no output), forward
# and backward, even with --allow-nonfinite (which lets them propagate without --deterministic).
$python - <<'PY'
import h5py, numpy as np, shutil
shutil.copy("f32.h5", "nan.h5")
with h5py.File("nan.h5", "r+") as f:
    x = f["do"][...]
    x[1, 7, 2, 3] = np.inf
    f["do"][...] = x
shutil.copy("f32.h5", "nan-k.h5")
with h5py.File("nan-k.h5", "r+") as f:
    x = f["k"][...]
    x[0, 30, 0, 1] = np.nan
    f["k"][...] = x
PY
expect "--deterministic forward refuses a k holding NaN" 2 "k holds NaN or Inf" "$mpiexec" --oversubscribe -np 3 "$ra" \
  run --input nan-k.h5 --output x.h5 --deterministic --allow-nonfinite
expect "--deterministic refuses a do holding Inf" 2 "do holds NaN or Inf" "$mpiexec" --oversubscribe -np 2 "$ra" run \
  --input nan.h5 --output x.h5 --backward --deterministic --allow-nonfinite
expect "without --deterministic it propagates" 0 "backward" "$mpiexec" --oversubscribe -np 2 "$ra" run --input nan.h5 \
  --output nan-out.h5 --backward --allow-nonfinite --quiet
no_output "the refusal leaves no output" x.h5
# --grad-wire bf16: the accumulators travel in bf16 (checked against bf16 inputs' tolerance); refused by name
# without --backward and for another dtype.
expect "ring -np 3 --grad-wire bf16 run --backward" 0 "backward" "$mpiexec" --oversubscribe -np 3 "$ra" run \
  --input ring.h5 --output wire.h5 --layout zigzag --causal --backward --grad-wire bf16 --quiet
expect "ring -np 3 --grad-wire bf16 verify" 0 "dv vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe -np 3 \
  "$ra" verify --input ring.h5 --output wire.h5 --layout zigzag --causal
expect "--grad-wire without --backward" 2 "add --backward" "$ra" run --input ring.h5 --output x.h5 --grad-wire bf16
expect "--grad-wire f16 refused" 2 "--grad-wire 'f16': expected f32 or bf16" "$ra" run --input ring.h5 --output x.h5 \
  --backward --grad-wire f16
expect "bench --grad-wire without --backward" 2 "--grad-wire applies to the backward pass" "$ra" bench --seq 16 --heads 2 \
  --head-dim 16 --grad-wire bf16
no_output "grad-wire refusals leave no output" x.h5
# An f32 file over the bf16 wire: verify allows the hops' bf16 roundings (the run's grad_wire and sequence_ranks
# attributes) and says so; without that allowance the same gradients fail f32's tolerance.
"$ra" generate --output wire32.h5 --batch 1 --seq 97 --kv-seq 61 --heads 4 --kv-heads 2 --head-dim 16 --with-grad \
  --with-sinks >/dev/null
expect "f32 over the bf16 wire: run" 0 "backward" "$mpiexec" --oversubscribe -np 4 "$ra" run --input wire32.h5 \
  --output wire32-out.h5 --causal --backward --grad-wire bf16 --quiet
expect "f32 over the bf16 wire: verify allows it" 0 "went over a bf16 wire" "$mpiexec" --oversubscribe -np 4 "$ra" verify \
  --input wire32.h5 --output wire32-out.h5 --causal
if $python -c "import h5py; h5py.File('wire32-out.h5', 'a').attrs.__delitem__('grad_wire')" 2>/dev/null; then
  expect "f32 over the bf16 wire: f32's tolerance fails it" 1 "dk vs f64 reference.*FAILED" "$mpiexec" --oversubscribe \
    -np 4 "$ra" verify --input wire32.h5 --output wire32-out.h5 --causal
fi
expect "bench --backward --step-times off the GPU ring" 2 "--step-times applies to the GPU ring" \
  "$mpiexec" --oversubscribe -np 2 "$ra" bench --backward --seq 16 --heads 2 --head-dim 16 --iters 1 --step-times
expect "bench --step-times off the GPU ring" 2 "--step-times applies to the GPU ring" \
  "$mpiexec" --oversubscribe -np 2 "$ra" bench --seq 16 --heads 2 --head-dim 16 --iters 1 --step-times
expect "bench --backward --json refused" 2 "--json applies to the forward bench" "$ra" bench --backward --seq 16 \
  --heads 2 --head-dim 16 --iters 1 --json x.json
expect "bench --f32-gradients without --backward" 2 "--f32-gradients applies to the backward pass" "$ra" bench --seq 16 \
  --heads 2 --head-dim 16 --iters 1 --f32-gradients
expect "bench --backward --f32-gradients" 0 "flash_attn2 *cpu *1 .* backward" "$ra" bench --backward --impl flash_attn2 \
  --seq 33 --heads 2 --head-dim 16 --iters 1 --f32-gradients
expect "bench --mask-documents: the ring's documents as a mask" 0 "ring *cpu *2 .*forward+backward" "$mpiexec" \
  --oversubscribe -np 2 "$ra" bench --backward --seq 67 --heads 2 --head-dim 16 --iters 1 --segments 3 --mask-documents
expect "bench --mask-documents without --segments" 2 "--mask-documents turns --segments N's documents into a mask" \
  "$ra" bench --seq 16 --heads 2 --head-dim 16 --iters 1 --mask-documents
expect "bench --mask-documents beside --mask" 2 "takes no --mask" "$ra" bench --seq 16 --heads 2 --head-dim 16 \
  --iters 1 --segments 2 --mask-documents --mask
expect "bench --mask-named without a mask" 2 "--mask-named names the call's mask: it needs --mask or --mask-documents" \
  "$ra" bench --seq 16 --heads 2 --head-dim 16 --iters 1 --mask-named
expect "bench --mask-named on the host" 2 "--mask-named: only the GPU kernels summarise a mask" \
  "$ra" bench --seq 16 --heads 2 --head-dim 16 --iters 1 --mask --mask-named
expect "bench --backward: the host ring on 2 ranks" 0 "ring *cpu *2 .*forward+backward" "$mpiexec" --oversubscribe -np 2 \
  "$ra" bench --backward --seq 67 --heads 4 --kv-heads 2 --head-dim 32 --causal --iters 2
expect "bench --backward: a local implementation" 0 "flash_attn2 *cpu *1 .* backward" "$ra" bench --backward \
  --impl flash_attn2 --seq 50 --heads 2 --head-dim 16 --iters 1
expect "bench --backward: Dv != D" 0 "flash_attn2 *cpu *1 .* 24/40 .* backward" "$ra" bench --backward \
  --impl flash_attn2 --seq 50 --heads 2 --head-dim 24 --v-head-dim 40 --iters 1
# 2-d meshes: the ring over sp with the batch (dp) or the heads (tp) split over the other axis.
for mesh in dp=2,sp=2 tp=2,sp=2; do
  expect "ring $mesh run --backward" 0 "backward" "$mpiexec" --oversubscribe -np 4 "$ra" run --input ring.h5 \
    --output mesh-$mesh.h5 --mesh $mesh --causal --backward --quiet
  expect "ring $mesh verify" 0 "dk vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe -np 4 "$ra" verify \
    --input ring.h5 --output mesh-$mesh.h5 --mesh $mesh --causal
done
# More tp ranks than kv heads (MQA on tp=2, GQA 8:2 on tp=4): each kv head held by the tp ranks of its query
# heads, its dK / dV the sum of theirs; equal to one rank's, and verified (a changed dk still caught); a tp
# that neither divides the kv heads nor is a multiple of them is refused by name.
"$ra" generate --output mqa.h5 --batch 2 --seq 39 --heads 4 --kv-heads 1 --head-dim 16 --with-grad --with-sinks \
  --seed 8 >/dev/null
"$ra" generate --output gqa.h5 --seq 41 --heads 8 --kv-heads 2 --head-dim 16 --dtype bf16 --with-grad --seed 9 >/dev/null
expect "MQA on one rank" 0 "backward" "$ra" run --input mqa.h5 --output mqa-1.h5 --causal --dropout 0.2 --backward \
  --f32-gradients --quiet
for case in "mqa tp=2,sp=2" "mqa tp=4" "gqa tp=4" "gqa dp=1,tp=4"; do
  set -- $case
  expect "kv heads shared over $2 ($1) run --backward" 0 "backward" "$mpiexec" --oversubscribe -np 4 "$ra" run \
    --input $1.h5 --output $1-$2.h5 --mesh $2 --causal --dropout 0.2 --backward --quiet
  expect "kv heads shared over $2 ($1) verify" 0 "dv vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe -np 4 \
    "$ra" verify --input $1.h5 --output $1-$2.h5 --mesh $2 --causal --dropout 0.2
done
expect "MQA on tp=2,sp=2 in f32" 0 "backward" "$mpiexec" --oversubscribe -np 4 \
  "$ra" run --input mqa.h5 --output mqa-4f32.h5 --mesh tp=2,sp=2 --causal --dropout 0.2 --backward --f32-gradients \
  --quiet --overwrite
expect "MQA on tp=2,sp=2 in f32 equals one rank's" 0 "same within f32 rounding" $python - <<'PY'
import h5py, numpy as np
with h5py.File("mqa-1.h5") as a, h5py.File("mqa-4f32.h5") as b:
    worst = max(float(np.abs(a[n][...] - b[n][...]).max() / np.abs(a[n][...]).max()) for n in ("dq", "dk", "dv", "dsinks"))
print("relative difference %.2e: %s" % (worst, "same within f32 rounding" if worst < 1e-5 else "DIFFERENT"))
PY
$python - <<'PY'
import h5py
with h5py.File("gqa-tp=4.h5", "r+") as f:
    f["dk"][0, 30, 1, 3] += 0.5
PY
expect "kv heads shared over tp: verify catches a changed dk once" 1 "dk vs f64 reference.*#wrong 1  FAILED" \
  "$mpiexec" --oversubscribe -np 4 "$ra" verify --input gqa.h5 --output gqa-tp=4.h5 --mesh tp=4 --causal --dropout 0.2
"$ra" generate --output kv4.h5 --seq 20 --heads 12 --kv-heads 4 --head-dim 8 --with-grad >/dev/null
expect "tp=6 over 4 kv heads is refused by name" 2 "'kv4.h5' dimension 2 (kv_heads) is 4: over mesh axis 'tp' of size 6" \
  "$mpiexec" --oversubscribe -np 6 "$ra" run --input kv4.h5 --output kv4-out.h5 --mesh tp=6
no_output "tp=6 over 4 kv heads leaves no output" kv4-out.h5
# dbias over ranks: each rank writes its rows, and where the bias is broadcast (here (1, 1, 1, S)) the
# ranks sharing an entry write the sum of their parts (over sp by the ring, over dp / tp after it).
expect "bias (1, Hq, T, S) on sp=2 run --backward" 0 "dbias" "$mpiexec" --oversubscribe -np 2 "$ra" run --input bf16.h5 \
  --output bias-sp2.h5 --causal --backward
expect "bias (1, Hq, T, S) on sp=2 verify" 0 "dbias vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe -np 2 \
  "$ra" verify --input bf16.h5 --output bias-sp2.h5 --causal
"$ra" generate --output shared.h5 --batch 2 --seq 45 --heads 4 --kv-heads 2 --head-dim 32 --dtype bf16 --with-grad \
  --seed 6 >/dev/null
$python - <<'PY'
import h5py, numpy as np
with h5py.File("shared.h5", "r+") as f:
    f["bias"] = np.random.default_rng(1).standard_normal((1, 1, 1, 45)).astype(np.float32)
PY
for mesh in sp=3 dp=2,sp=2 tp=2,sp=2; do
  n=$(( $(sed 's/[a-z]*=//g; s/,/*/g' <<<"$mesh") ))
  expect "bias (1, 1, 1, S) on $mesh run --backward" 0 "dbias" "$mpiexec" --oversubscribe -np $n "$ra" run \
    --input shared.h5 --output shared-$mesh.h5 --mesh $mesh --causal --backward --f32-gradients
  expect "bias (1, 1, 1, S) on $mesh verify" 0 "dbias vs f64 reference.*#wrong 0  OK" "$mpiexec" --oversubscribe -np $n \
    "$ra" verify --input shared.h5 --output shared-$mesh.h5 --mesh $mesh --causal
done
expect "bias (1, 1, 1, S) on one rank" 0 "dbias" "$ra" run --input shared.h5 --output shared-1.h5 --causal --backward \
  --f32-gradients
expect "dbias the same on 1 rank and on tp=2,sp=2" 0 "same within f32 rounding" $python - <<'PY'
import h5py, numpy as np
a, b = (h5py.File(n)["dbias"][...] for n in ("shared-1.h5", "shared-tp=2,sp=2.h5"))
d = float(np.abs(a - b).max() / np.abs(a).max())
print("relative difference %.2e: %s" % (d, "same within f32 rounding" if d < 1e-5 else "DIFFERENT"))
PY
# verify on a split sequence checks every rank's dK rows (summed over the ranks' queries): a change is caught.
$python - <<'PY'
import h5py
with h5py.File("ring-3-striped-ring.h5", "r+") as f:
    f["dk"][0, 40, 1, 7] += 0.25
PY
expect "ring verify catches a changed dk" 1 "dk vs f64 reference.*#wrong 1  FAILED" "$mpiexec" --oversubscribe -np 3 \
  "$ra" verify --input ring.h5 --output ring-3-striped-ring.h5 --layout striped --causal
# The gradients do not depend on the ring's size beyond f32 rounding (written in f32 here).
expect "ring -np 1 f32 gradients" 0 "backward" "$ra" run --input ring.h5 --output ring1.h5 --causal --backward \
  --f32-gradients --quiet
expect "ring -np 3 f32 gradients" 0 "backward" "$mpiexec" --oversubscribe -np 3 "$ra" run --input ring.h5 \
  --output ring3.h5 --causal --layout zigzag --backward --f32-gradients --quiet
expect "ring size does not change the gradients" 0 "same within f32 rounding" $python - <<'PY'
import h5py, numpy as np
with h5py.File("ring1.h5") as a, h5py.File("ring3.h5") as b:
    worst = max(float(np.abs(a[n][...] - b[n][...]).max() / (np.abs(a[n][...]).max() + 1e-30)) for n in ("dq", "dk", "dv"))
print("relative difference %.2e: %s" % (worst, "same within f32 rounding" if worst < 1e-5 else "DIFFERENT"))
PY
echo "backward_cli_test: $passes passed, $fails failed"
[ $fails -eq 0 ]
