#!/usr/bin/env bash
# `ringattn run --backward` end to end (issue 20): generate --with-grad -> run --backward -> verify of
# o, lse, dq, dk, dv and dbias against the f64 oracle, for every CPU implementation; a corrupted
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
expect "ring backward refused on every rank" 2 "\[rank 1\] ringattn: error: --backward runs on one sequence shard" \
  "$mpiexec" --oversubscribe -np 2 "$ra" run --input f32.h5 --output x.h5 --backward
no_output "refusals leave no output" x.h5
echo "backward_cli_test: $passes passed, $fails failed"
[ $fails -eq 0 ]
