#!/bin/bash
# One device call's check of the wgmma forward's 192-column instance and the soft cap's shorter tanh
# (bench/RESULTS.md, "The wgmma forward at head_dim 192; the soft cap's tanh in eleven instructions"): the GPU
# unit tests, the GPU ring's D = 192 and soft-cap cases over 2 ranks (sharing the GPU where there is one), CLI
# round trips, then forward / backward rows at T = 32768 beside PyTorch's SDPA in the same call.
#   bash .device/on-device.sh bash bench/forward192_softcap_check.sh PACK [ROUNDS [UNIT_FILTER [ROWS]]]   (PACK from
#   bench/pack_for_device.sh, its lib as pack.tar.xz where the carry needs it; carry .device and PACK; ROWS `all`, or
#   `softcap` for the soft-cap rows and their uncapped control only)
set -u
b=${1:-build-pack-new}; rounds=${2:-2}; filter=${3:-*}; rows=${4:-all}; bin=$b/bin/ringattn; out=${OUT:-/tmp/out}
mkdir -p "$out"
[ -f $b/pack.tar.xz ] && tar xJf $b/pack.tar.xz -C $b
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $out/device.txt
$b/tests/cuda_attention_test --gtest_filter="$filter" --gtest_color=no > $out/unit.log 2>&1
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $out/unit.log | head -20
for t in ring_mpi_test ring_backward_mpi_test; do
  mpirun -np 2 $b/tests/$t --backend=cuda --gtest_filter='*192*:*softcap*' --gtest_color=no > $out/$t.log 2>&1
  echo "$t: $(grep -E '^\[  (PASSED|FAILED) ' $out/$t.log | sort -u | tr '\n' ' ')"
done
d=$(mktemp -d)
$bin generate --output $d/mla.h5 --batch 1 --seq 1500 --heads 8 --kv-heads 2 --head-dim 192 --v-head-dim 128 --dtype bf16 \
  --with-grad --segments 5 >/dev/null
$bin generate --output $d/wide.h5 --batch 2 --seq 777 --kv-seq 901 --heads 4 --kv-heads 4 --head-dim 160 --dtype f16 >/dev/null
for f in mla wide; do for flags in "" "--causal" "--softcap 30" "--softcap 30 --causal"; do
  grad=$([ $f = mla ] && echo --backward)  # mla.h5 has do: its gradients are checked too
  $bin run --backend cuda --impl flash_attn2 --flash-kernel wgmma --input $d/$f.h5 --output $d/o.h5 $flags $grad --quiet --overwrite &&
    echo "$f $flags: $($bin verify --input $d/$f.h5 --output $d/o.h5 $flags | grep -c '#wrong 0') outputs verified" | tee -a $out/cli.log
done; done
# PyTorch's SDPA (FlashAttention-2 and cuDNN backends) on the same shapes first, then ours: TFLOP/s forward /
# backward (true dims), median of --iters after 2 warm-ups, ROUNDS rounds.
if [ "$rows" = all ]; then
  python3 bench/torch_backward.py --forward 16x192 16x192x128 16x160 16x256 32x128 > $out/torch_forward.txt 2>&1
  python3 bench/torch_backward.py 16x192 16x192x128 > $out/torch_backward.txt 2>&1
  cat $out/torch_forward.txt $out/torch_backward.txt | grep -v "^#"
fi
bench() {
  mpirun -np 1 $bin bench --backend cuda --impl flash_attn2 --batch 1 --dtype bf16 --warmup 2 --backward "$@" 2>&1 |
    grep -v '^#' | grep -o "forward  *[0-9.]*  *[0-9.]*\|backward  *[0-9.]*  *[0-9.]*" | tr '\n' ' '
}
for round in $(seq $rounds); do
  for causal in "" "--causal"; do
    shapes=("16 192 192" "16 192 128" "16 160 160" "16 256 256" "32 128 128")
    [ "$rows" = all ] || shapes=("32 128 128")
    for shape in "${shapes[@]}"; do
      set -- $shape
      echo "round $round H=$1 D=$2 Dv=$3 $causal: $(bench --seq 32768 --iters 8 --heads $1 --head-dim $2 --v-head-dim $3 $causal)" |
        tee -a $out/bench.txt
    done
    flag_sets=("--softcap 50" "--softcap 50 --segments 16" "--segments 16")
    [ "$rows" = all ] || flag_sets=("--softcap 50")
    for flags in "${flag_sets[@]}"; do
      echo "round $round H=32 D=128 $flags $causal: $(bench --seq 32768 --iters 8 --heads 32 --head-dim 128 $flags $causal)" |
        tee -a $out/bench.txt
    done
    echo "round $round H=16 D=256 --softcap 50 $causal: $(bench --seq 32768 --iters 8 --heads 16 --head-dim 256 --softcap 50 $causal)" |
      tee -a $out/bench.txt
  done
  echo "round $round mma_sync T=16384 --softcap 50: $(bench --seq 16384 --iters 5 --heads 32 --head-dim 128 --flash-kernel mma_sync --softcap 50)" |
    tee -a $out/bench.txt
done
