#!/usr/bin/env bash
# Fail-stop under faults (RINGATTN_FAULT) and bad data, on 3 CPU ranks: a rank that dies at the
# first, a middle and the last ring step, a stalled rank, a corrupted block (the same in the backward's
# ring, and a corrupted dK/dV accumulator), a short send, a full
# disk, ranks started with different options, NaN inputs, a tampered output. Each case asserts a non-zero exit within a
# deadline, the message, and that no output file appears under its final name.
# Usage: fault_test.sh RINGATTN MPIEXEC [BACKEND]   (BACKEND cuda: 2 ranks on GPUs, NCCL or copy engines)
#   FAULT_ONLY=S runs only the cases whose names hold S (backward: the backward's).
set -u
ra=$1; mpiexec=$2; backend=${3:-cpu}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
python=/usr/bin/python3; [ -x $python ] || python=python3
n=3; [ "$backend" = cuda ] && n=2
if [ "$backend" = cuda ] && ! nvidia-smi -L 2>/dev/null | grep -q "^GPU 0"; then
  echo "skip: the cuda cases need a GPU"; exit 77
fi  # with one GPU the two ranks share it: the ring runs over copy engines instead of NCCL
fails=0; passes=0
# expect NAME WANT(zero|nonzero) DEADLINE_S PATTERN OUTPUT -- command...
expect() {
  local name=$1 want=$2 deadline=$3 pattern=$4 output=$5; shift 6
  [[ "$name" == *"${FAULT_ONLY:-}"* ]] || return 0  # FAULT_ONLY=backward: the cases whose names hold it
  local start out code took ok=1
  start=$(date +%s)
  out=$(timeout $((deadline + 30)) "$@" 2>&1); code=$?
  took=$(( $(date +%s) - start ))
  if [ "$want" = zero ]; then [ $code -eq 0 ] || ok=0; else [ $code -ne 0 ] || ok=0; fi
  [ $took -le "$deadline" ] || ok=0
  grep -q -- "$pattern" <<<"$out" || ok=0
  [ -n "$output" ] && [ "$want" != zero ] && { [ -e "$output" ] || [ -e "$output.partial" ]; } && ok=0
  if [ $ok -eq 1 ]; then passes=$((passes+1)); echo "ok   $name (exit $code, ${took}s)";
  else fails=$((fails+1)); echo "FAIL $name (exit $code, ${took}s, deadline ${deadline}s, pattern '$pattern')"; echo "$out" | grep -v "^$" | tail -20; fi
}
dtype=f32; [ "$backend" = cuda ] && dtype=bf16
"$ra" generate --output "$dir/in.h5" --seq 192 --heads 4 --head-dim 64 --dtype $dtype >/dev/null || exit 1
common=(--input "$dir/in.h5" --backend "$backend" --timeout 5)

last=$((n - 1))
for kind in kill term abort exit; do
  for step in 0 1 $last; do
    [ $kind != kill ] && [ $step != 1 ] && continue   # every kind once, kill at every position
    # The survivors, ended by the launcher, say which ring step they were on.
    expect "$kind-rank1-step$step" nonzero 60 "rank [02]\] ringattn: ended by signal 15 while \(ring step\|the attention\)" "$dir/o.h5" -- \
      env RINGATTN_FAULT=$kind:rank=1:step=$step "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${common[@]}" --output "$dir/o.h5"
  done
done
stall_step=1; [ $n -eq 2 ] && stall_step=0  # a step that still has an exchange after it
expect stall-rank1-in-ring nonzero 40 "ring step [0-9].*rank 1" "$dir/o.h5" -- \
  env RINGATTN_FAULT=stall:rank=1:step=$stall_step:ms=600000 "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${common[@]}" --output "$dir/o.h5"
# A rank that stalls after the ring's last exchange: the others wait in collective writes, and the
# watchdog (--io-timeout) ends the job.
expect stall-after-ring nonzero 45 "did not finish within" "$dir/o.h5" -- \
  env RINGATTN_FAULT=stall:rank=1:step=$last:ms=600000 "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${common[@]}" --output "$dir/o.h5" --io-timeout 5
# A corrupted block: caught by the block checksum (one definition on both rings, attention/ring/block_seal.h), or with
# checksums off by the output invariants.
expect corrupt-block-caught-by-checksum nonzero 60 "was corrupted in flight" "$dir/o.h5" -- \
  env RINGATTN_FAULT=corrupt:rank=$last:step=0 "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${common[@]}" --output "$dir/o.h5"
expect corrupt-block-caught-by-output-check nonzero 60 "output check" "$dir/o.h5" -- \
  env RINGATTN_FAULT=corrupt:rank=$last:step=0 "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${common[@]}" --output "$dir/o.h5" --no-block-checksums
# The backward's ring walk (pass=backward: the forward before it walks the same steps): a killed and a
# stalled rank, a corrupted K/V block, and a corrupted dK/dV accumulator on its last hop home (step N).
"$ra" generate --output "$dir/g.h5" --seq 192 --heads 4 --head-dim 64 --dtype $dtype --with-grad >/dev/null || exit 1
grad=(--input "$dir/g.h5" --backend "$backend" --timeout 5 --backward)
expect kill-rank1-backward-step1 nonzero 60 "rank [02]\] ringattn: ended by signal 15 while \(ring backward\|the backward pass\)" "$dir/o.h5" -- \
  env RINGATTN_FAULT=kill:rank=1:step=1:pass=backward "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${grad[@]}" --output "$dir/o.h5"
expect stall-rank1-in-backward nonzero 45 "within [0-9]* ms\|waited [0-9]* ms" "$dir/o.h5" -- \
  env RINGATTN_FAULT=stall:rank=1:step=0:ms=600000:pass=backward "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${grad[@]}" --output "$dir/o.h5"
expect corrupt-block-in-backward nonzero 60 "K/V block.*corrupted in flight" "$dir/o.h5" -- \
  env RINGATTN_FAULT=corrupt:rank=$last:step=0:pass=backward "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${grad[@]}" --output "$dir/o.h5"
expect corrupt-accumulator-backward-last-hop nonzero 60 "dK/dV accumulator.*corrupted in flight" "$dir/o.h5" -- \
  env RINGATTN_FAULT=corrupt:rank=0:step=$n:pass=backward "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${grad[@]}" --output "$dir/o.h5"
if [ "$backend" = cpu ]; then  # NCCL cannot send fewer bytes than the peer receives
  expect short-send-caught nonzero 60 "received [0-9]* of [0-9]* bytes from rank 0 (a short send)" "$dir/o.h5" -- \
    env RINGATTN_FAULT=short:rank=0:step=0 "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${common[@]}" --output "$dir/o.h5"
fi
# A full disk, as a file-size limit on the ranks (ulimit -f, KiB): refused before the compute by the
# space check, and with the check off the failed collective write ends within --io-timeout. Either
# way no file is left, not even the .partial one.
expect file-size-limit-checked-first nonzero 60 "may write files of at most" "$dir/o.h5" -- \
  "$mpiexec" --oversubscribe -np $n bash -c "ulimit -f 64; exec \"\$0\" \"\$@\"" "$ra" run "${common[@]}" --output "$dir/o.h5"
# (Ranks sharing one GPU have no NCCL to fall back on where a file-size limit stops interprocess CUDA
# events: they stop before the write, naming that.)
midway="disk full?\|checking and writing the outputs did not finish within 5 s\|cannot make an interprocess CUDA event"
expect write-fails-midway nonzero 45 "$midway" "$dir/o.h5" -- \
  "$mpiexec" --oversubscribe -np $n bash -c "ulimit -f 64; exec \"\$0\" \"\$@\"" "$ra" run "${common[@]}" --output "$dir/o.h5" \
  --no-space-check --io-timeout 5
expect different-options nonzero 60 "started with different options" "$dir/o.h5" -- \
  "$mpiexec" --oversubscribe -np 1 "$ra" run "${common[@]}" --output "$dir/o.h5" --causal : -np $((n - 1)) "$ra" run "${common[@]}" --output "$dir/o.h5"
expect bad-fault-spec nonzero 60 "unknown kind 'explode'" "$dir/o.h5" -- \
  env RINGATTN_FAULT=explode:rank=0:step=0 "$mpiexec" --oversubscribe -np $n -x RINGATTN_FAULT "$ra" run "${common[@]}" --output "$dir/o.h5"

# Bad files and paths: refused on every rank before any exchange, exit 2, nothing written.
bad() {  # bad NAME PATTERN FILE [extra run options]
  local name=$1 pattern=$2 file=$3; shift 3
  expect "$name" nonzero 60 "$pattern" "$dir/o.h5" -- \
    "$mpiexec" --oversubscribe -np $n "$ra" run --input "$file" --backend "$backend" --output "$dir/o.h5" "$@"
}
head -c 3000 "$dir/in.h5" > "$dir/truncated.h5"
bad truncated-file "cannot open HDF5 file '$dir/truncated.h5'" "$dir/truncated.h5"
expect missing-output-dir nonzero 60 "directory '$dir/none' does not exist" "$dir/none/o.h5" -- \
  "$mpiexec" --oversubscribe -np $n "$ra" run --input "$dir/in.h5" --backend "$backend" --output "$dir/none/o.h5"
# An output directory this user cannot write to (root writes anywhere: then the run is as nobody).
mkdir -p "$dir/ro/out" && chmod 755 "$dir" "$dir/ro" && chmod 644 "$dir/in.h5" && chmod 555 "$dir/ro/out"
as_user=(); [ "$(id -u)" = 0 ] && command -v runuser >/dev/null && as_user=(runuser -u nobody --)
if [ "$(id -u)" != 0 ] || [ ${#as_user[@]} -gt 0 ]; then
  # nobody may not reach the build tree (a checkout under /root is not theirs): a copy of the binary
  # in the test's own directory, whatever the clone's path.
  cp "$ra" "$dir/ringattn_copy" && chmod 755 "$dir/ringattn_copy"
  expect unwritable-output-dir nonzero 60 "directory '$dir/ro/out' is not writable" "$dir/ro/out/o.h5" -- \
    "${as_user[@]}" "$dir/ringattn_copy" run --input "$dir/in.h5" --backend "$backend" --output "$dir/ro/out/o.h5"
fi
if $python -c "import h5py" 2>/dev/null; then
  $python - "$dir" <<'PY'
import sys, h5py, numpy as np
d, r = sys.argv[1], np.random.default_rng(0)
f32 = lambda *s: r.standard_normal(s).astype(np.float32)
def mk(name, q, k, v=None):
    with h5py.File(f"{d}/{name}.h5", "w") as f:
        f["q"], f["k"] = q, k
        if v is not None:
            f["v"] = v
mk("int", r.integers(0, 5, (1, 192, 4, 64)).astype(np.int32), f32(1, 192, 4, 64), f32(1, 192, 4, 64))
mk("f64", r.standard_normal((1, 192, 4, 64)), r.standard_normal((1, 192, 4, 64)), r.standard_normal((1, 192, 4, 64)))
mk("kvlen", f32(1, 192, 4, 64), f32(1, 192, 4, 64), f32(1, 180, 4, 64))
mk("heads", f32(1, 192, 3, 64), f32(1, 192, 2, 64), f32(1, 192, 2, 64))
mk("rank3", f32(192, 4, 64), f32(1, 192, 4, 64), f32(1, 192, 4, 64))
mk("nov", f32(1, 192, 4, 64), f32(1, 192, 4, 64))
PY
  bad missing-dataset "input '$dir/nov.h5' has no dataset 'v'" "$dir/nov.h5"
  bad int-dtype "dataset 'q' of '$dir/int.h5' holds int32, expected float32, float16 or bfloat16" "$dir/int.h5"
  bad f64-dtype-not-converted "holds float64, expected float32, float16 or bfloat16" "$dir/f64.h5"
  bad kv-lengths-differ "dataset 'v' of '$dir/kvlen.h5' dimension 1 (kv_len) is 180, expected 192" "$dir/kvlen.h5"
  bad heads-not-multiple "dimension 2 (q_heads) is 3, expected a multiple of k's kv_heads = 2" "$dir/heads.h5"
  bad wrong-rank "has rank 3 (shape (192, 4, 64)), expected 4" "$dir/rank3.h5"
fi

# NaN in the input: refused by default, accepted (and reported) with --allow-nonfinite.
if $python -c "import h5py" 2>/dev/null; then
  cp "$dir/in.h5" "$dir/nan.h5"
  $python -c "import h5py, numpy as np; f = h5py.File('$dir/nan.h5', 'r+'); q = f['q'][...]; q[0, 5, 1, 3] = np.nan; f['q'][...] = q"
  expect nan-input-refused nonzero 60 "dataset 'q' holds 1 NaN or Inf" "$dir/o.h5" -- \
    "$mpiexec" --oversubscribe -np $n "$ra" run --input "$dir/nan.h5" --backend "$backend" --output "$dir/o.h5"
  expect nan-input-allowed zero 60 "holds 1 NaN or Inf values (--allow-nonfinite)" "" -- \
    "$mpiexec" --oversubscribe -np $n "$ra" run --input "$dir/nan.h5" --backend "$backend" --output "$dir/nan_out.h5" --allow-nonfinite
  # A clean run, then its output changed after the fact: verify refuses it by the manifest checksum.
  expect clean-run zero 60 "ringattn run" "" -- "$mpiexec" --oversubscribe -np $n "$ra" run "${common[@]}" --output "$dir/good.h5"
  expect verify-clean zero 60 "#wrong 0  OK" "" -- "$ra" verify --input "$dir/in.h5" --output "$dir/good.h5"
  $python -c "import h5py; f = h5py.File('$dir/good.h5', 'r+'); l = f['lse'][...]; l[0, 0, 7] += 1e-3; f['lse'][...] = l"
  expect verify-tampered nonzero 60 "does not match the manifest" "" -- "$ra" verify --input "$dir/in.h5" --output "$dir/good.h5"
else
  echo "skip NaN / tamper cases: no h5py"
fi
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
