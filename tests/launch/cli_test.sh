#!/usr/bin/env bash
# CLI round trip and bad-input checks: generate -> run (mpirun, 2 ranks) -> verify, bench on the host, then errors that
# must exit non-zero with a message naming the problem and leave no output file.
# Usage: cli_test.sh RINGATTN MPIEXEC
set -u
ra=$1; mpiexec=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fails=0; passes=0
check() {  # check NAME EXPECTED_CODE PATTERN -- command...
  local name=$1 want=$2 pattern=$3; shift 4
  local out code
  out=$("$@" 2>&1); code=$?
  if [ "$code" -eq "$want" ] && grep -q -- "$pattern" <<<"$out"; then passes=$((passes+1)); echo "ok   $name";
  else fails=$((fails+1)); echo "FAIL $name (exit $code, wanted $want; pattern '$pattern')"; echo "$out" | tail -5; fi
}
mpi() { "$mpiexec" --oversubscribe -np "$@"; }

check generate 0 "wrote .* bf16, mask, segment_ids (2 documents)" -- "$ra" generate --output "$dir/in.h5" --batch 1 --seq 128 --heads 4 --kv-heads 2 --head-dim 64 --dtype bf16 --with-mask --segments 2
check generate-batch2 0 "wrote" -- "$ra" generate --output "$dir/b2.h5" --batch 2 --seq 96 --heads 4 --kv-heads 2 --head-dim 32 --dtype f16 --with-bias
check generate-segments-past-seq 2 "--segments 11 must be between 0 and --seq 10" -- "$ra" generate --output "$dir/s.h5" --seq 10 --heads 2 --head-dim 8 --segments 11
check generate-segments-negative 2 "--segments -1 must be between 0 and --seq 10" -- "$ra" generate --output "$dir/s.h5" --seq 10 --heads 2 --head-dim 8 --segments=-1
check generate-output-directory 2 "output '$dir' is a directory: name a file" -- "$ra" generate --output "$dir" --seq 8 --heads 1 --head-dim 8 --overwrite
check generate-output-under-a-file 2 "output '$dir/b2.h5/x.h5': '$dir/b2.h5' is a file, not a directory" -- "$ra" generate --output "$dir/b2.h5/x.h5" --seq 8 --heads 1 --head-dim 8
check bench-json-directory-missing 2 "--json '/nonexistent/dir/x.json': directory '/nonexistent/dir' does not exist" -- "$ra" bench --seq 64 --heads 2 --head-dim 16 --json /nonexistent/dir/x.json
check bench-warmup-negative 2 "--warmup is -1, expected 0 or more" -- "$ra" bench --seq 64 --heads 2 --head-dim 16 --warmup=-1
check run-ring-2 0 "ring (cpu) on mesh sp=2, layout zigzag" -- mpi 2 "$ra" run --input "$dir/in.h5" --output "$dir/out.h5" --causal
check verify-ring-2 0 "#wrong 0  OK" -- mpi 2 "$ra" verify --input "$dir/in.h5" --output "$dir/out.h5" --causal
check run-dp2-sp2 0 "on mesh dp=2,sp=2" -- mpi 4 "$ra" run --input "$dir/b2.h5" --output "$dir/dp.h5" --mesh dp=2,sp=2 --layout striped
check verify-dp2-sp2 0 "#wrong 0  OK" -- mpi 4 "$ra" verify --input "$dir/b2.h5" --output "$dir/dp.h5" --mesh dp=2,sp=2 --layout striped
check run-tp2-sp2 0 "on mesh tp=2,sp=2" -- mpi 4 "$ra" run --input "$dir/b2.h5" --output "$dir/tp.h5" --mesh tp=2,sp=2 --causal --window 40,0
check verify-tp2-sp2 0 "#wrong 0  OK" -- "$ra" verify --input "$dir/b2.h5" --output "$dir/tp.h5" --causal --window 40,0
# --deterministic: the same bits from 1 rank (zigzag) and 3 ranks (striped), O and LSE.
check run-deterministic-1 0 "on mesh sp=1" -- mpi 1 "$ra" run --input "$dir/b2.h5" --output "$dir/det1.h5" --causal --deterministic
check run-deterministic-3 0 "on mesh sp=3, layout striped" -- mpi 3 "$ra" run --input "$dir/b2.h5" --output "$dir/det3.h5" --causal --deterministic --layout striped
same_bits() {  # same_bits A.h5 B.h5 DATASET: byte-for-byte equal dataset contents
  h5dump -d "/$3" -b LE -o "$dir/a.bin" "$1" >/dev/null && h5dump -d "/$3" -b LE -o "$dir/b.bin" "$2" >/dev/null &&
    cmp "$dir/a.bin" "$dir/b.bin" && echo "identical $3"
}
check deterministic-same-o 0 "identical o" -- same_bits "$dir/det1.h5" "$dir/det3.h5" o
check deterministic-same-lse 0 "identical lse" -- same_bits "$dir/det1.h5" "$dir/det3.h5" lse
check deterministic-verify 0 "#wrong 0  OK" -- "$ra" verify --input "$dir/b2.h5" --output "$dir/det3.h5" --causal
check deterministic-not-ring 2 "--deterministic on the host applies to --impl ring" -- "$ra" run --input "$dir/b2.h5" --output "$dir/x.h5" --impl sdpa --deterministic
# bench on the host: a CUDA build must not touch the GPU (or need a driver) for --backend cpu.
check bench-ring-cpu 0 "ring      cpu      2" -- mpi 2 "$ra" bench --impl ring --seq 128 --heads 2 --head-dim 16 --iters 2 --causal
check bench-v-head-dim 0 "ring      cpu      2 .* 32/24 " -- mpi 2 "$ra" bench --impl ring --seq 96 --heads 2 --head-dim 32 --v-head-dim 24 --iters 1
check bench-v-head-dim-zero 2 "--v-head-dim is -8, expected a positive integer" -- "$ra" bench --seq 16 --heads 2 --head-dim 16 --v-head-dim -8
check bench-json 0 '"impl": "ring"' -- bash -c "\"$ra\" bench --seq 64 --heads 2 --head-dim 16 --iters 1 --json $dir/b.json >/dev/null && cat $dir/b.json"
# verify given other options than run had: refused naming both (every element would fail, as if the kernels were wrong).
check verify-other-options-refused 2 "was written by run with the options --scale 0.125 --causal .* but verify was given --scale 0.125 --window" -- "$ra" verify --input "$dir/in.h5" --output "$dir/out.h5"
check refuses-existing-output 2 "exists; refusing to replace it" -- "$ra" run --input "$dir/in.h5" --output "$dir/out.h5"
check negative-heads 2 "--heads is -1, expected a positive integer" -- "$ra" generate --output "$dir/x.h5" --seq 8 --heads -1 --head-dim 8
check malformed-window 2 "--window '5' is not L,R" -- "$ra" run --input "$dir/in.h5" --output "$dir/x.h5" --window 5
check zero-mesh-axis 2 "mesh axis 'sp' has size 0" -- "$ra" run --input "$dir/in.h5" --output "$dir/x.h5" --mesh sp=0
check mesh-size-mismatch 2 "has 4 ranks but the job has 2" -- mpi 2 "$ra" run --input "$dir/in.h5" --output "$dir/x.h5" --mesh sp=4
check missing-file 2 "cannot open HDF5 file '$dir/none.h5'" -- "$ra" run --input "$dir/none.h5" --output "$dir/x.h5"
check unknown-option 2 "unrecognised option '--bogus'" -- "$ra" run --input "$dir/in.h5" --output "$dir/x.h5" --bogus
check unknown-ring-transport 2 "ring transport 'ipc' is unknown: expected auto, nccl or copy-engines" -- "$ra" run --input "$dir/in.h5" --output "$dir/x.h5" --ring-transport ipc
# --flash-kernel chooses the CUDA flash_attn2 kernels: an unknown name, or a forced kernel where none of them runs
# (the host, or another kernel), is refused by name, never ignored.
check unknown-flash-kernel 2 "--flash-kernel 'tma': expected auto, mma_sync or wgmma" -- "$ra" run --input "$dir/in.h5" --output "$dir/x.h5" --flash-kernel tma
check flash-kernel-on-the-host 2 "flash_kernel wgmma chooses the kernels of flash_attn2 on cuda (and of the GPU ring over it), but implementation 'ring' on cpu runs none of them" -- "$ra" run --input "$dir/in.h5" --output "$dir/x.h5" --flash-kernel wgmma
check flash-kernel-of-another-kernel 2 "implementation 'sdpa' on cpu runs none of them" -- "$ra" bench --impl sdpa --seq 16 --heads 2 --head-dim 16 --flash-kernel mma_sync
# 128 tokens over 3 ranks (zigzag: 6 chunks of 21 or 22): uneven shards, no padding asked.
check uneven-shards-run 0 "on mesh sp=3, layout zigzag" -- mpi 3 "$ra" run --input "$dir/in.h5" --output "$dir/uneven.h5" --causal
check uneven-shards-verify 0 "#wrong 0  OK" -- mpi 3 "$ra" verify --input "$dir/in.h5" --output "$dir/uneven.h5" --causal
if [ -e "$dir/x.h5" ] || [ -e "$dir/x.h5.partial" ]; then fails=$((fails+1)); echo "FAIL an output file was left behind"; fi
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
