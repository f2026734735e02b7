#!/bin/bash
# What one device-machine call runs (see ../shared/device/README.md), from the repository root, after
# `bash .device/on-device.sh`. Stages: `check` (the build's SASS checked for wgmma a warp may issue diverged, GPU unit tests, ring on 2 GPUs, CLI round trip) and
# `bench` (the tables of bench/RESULTS.md), `ring`, `cudnn`, `faults`, `ctas` (the ring at 8192 tokens
# per GPU under NCCL's CTA counts and chunk sizes), `kernels` (the mma.sync and wgmma flash kernels side by side),
# `causal` (the causal rows only), `priority` (the ring with its NCCL stream at high and at default
# priority; needs build/variants/ringattn_normal_priority), `staging` (pinned against pageable),
# `probe` (the ring against its local kernel, GPU clocks and power sampled), `steps` (the ring's
# per-step device times), `tables` (the ratio rows at 8192-32768 tokens per GPU), `wide` (head_dim 256), `scaling`
# (issue 7's T = 65536 to 1M rows on 1, 2 and 4 GPUs), `transport` (the ring over NCCL and over copy
# engines: tests, then side by side), `ratio` (kernel tests, then the ratio rows at 8192 tokens per GPU), `ab` (this
# build's ringattn against the variants/ringattn_before_* binaries, interleaved), `versus` (the same for every variant; ring_seqs="16384 32768" sets the ring rows' T), `chain` (the ring's kernels on one GPU, ring_chain_gpu_bench), `aim` (one GPU and the ring at 8192 and 16384 tokens per GPU, causal and not, with the variants), `checksums` (the ring with and without block checksums, and the variants), `outside` (every rank's time outside its kernels, and its kernel chain), `contention` (the ring with and without block checksums against the variants);
# `backward` (issue 20: GPU tests, CLI --backward round trips, bench --backward beside PyTorch's SDPA backward),
# `backward_ab` (the flash backward of this build against the variants, interleaved); `backward_kernels` (the
# GPU tests, then the wgmma and mma.sync flash backward kernels interleaved beside PyTorch's SDPA backward); `ring_backward` (issue 21:
# the GPU ring's forward and backward tests on however many GPUs there are, ranks sharing them where fewer,
# the CLI's run --backward over the GPU ring, and the ring of one against its local kernel), `ring_memory` (the
# ring backward's peak device memory per rank on 2 ranks); `python` (issue 22: the Python package's CUDA tests, on one GPU
# and over the GPU ring, then what it costs beside the C++ bench); `two_gpus` (issues 21 / 22 on 2 GPUs: the ring
# backward per GPU beside one GPU's at the same global T, the bf16 grad wire, PyTorch context_parallel in the same
# call, the Python ring beside the C++ bench, then 1M tokens causal); `two_gpus_tests` (the GPU ring's forward and
# backward tests over copy engines and over NCCL, the backward's faults, the training example on 2 GPUs); `cache`
# (the device cache of call temporaries: GPU tests, bench --backward against the variants, the Python layer's cost);
# `documents` (packed documents, segment ids skipping blocks: GPU tests, then forward and backward with
# --segments beside PyTorch's FlexAttention and varlen SDPA, and the dense rows against the variants);
# `wide_backward` (head_dim 256 in the flash backward: tests, CLI, the ring, both kernels' rows against the variants);
# `padding_ab` (GPU tests, then the flash kernels whose exact head dims run the padded instance, and the ring of 2 on one GPU, against the variants);
# `python_tests` (the Python package's tests, CUDA and host tensors, one GPU); `backward_spans` (the ring backward's
# computes, adds, transfers and waits per rank, --step-times, beside one GPU's backward); `ring_backward_ab` (the ring
# backward of this build against the variants, interleaved, then one GPU's rows and the spans); `tile_order_ab` (GPU
# tests, then the single-call and ring backward of this build against the variants, interleaved, and the ring's spans);
# `ring_streams_ab` (GPU tests over both transports, the ring CLI's --backward, then the same rows against the variants);
# `ring_priority` (the same tests, the forward ring's too, the backward's faults, then one GPU's and the ring's rows);
# `head_dims_backward` (GPU tests, then the flash backward at FlashAttention-2's head dims against the variants, beside
# PyTorch's SDPA backward); `dq_adds_ab` (the other kernels that add dQ, against the variants); `dq_apart_ab` (GPU
# tests, then D = 192 / 256 with dQ by its own kernel, default and --deterministic, against the variants, and PyTorch's); `ring_sizes` (the GPU
# ring's tests at 3 and 4 ranks, then `cudnn` steps on 2 GPUs at T = 131072 interleaved with PyTorch
# context_parallel's cuDNN backward); `cudnn_streams_ab` (the ring's cudnn steps on
# two streams: its tests, then the ring against the variants, one GPU's cudnn rows and context_parallel's); `tma_ab` (GPU
# tests, then the wgmma kernels with TMA tile loads, forward and backward, against the variants, and PyTorch's SDPA);
# `share_rows` (one GPU's backward and the ring of 2's, no tests); `carry_tma_ab` (GPU tests, then the ring of 2's
# forward and backward, its steps' forward by TMA, against the variants, and one GPU's rows); `readme_tables` (the README's
# performance tables: one GPU's and the ring of 2's forward and backward, PyTorch's SDPA and context_parallel beside them, made
# into tables by bench/readme_tables.py); `million` (1M tokens causal, forward and backward, on 2 GPUs with each local kernel);
# `mesh_dropout` (dropout on dp / tp meshes of GPUs, the bf16 wire's verify); `cli_sweep` (random CLI round trips with
# --backend cuda, tests/launch/cli_sweep.py); `any_head_dim` (sdpa past 256 columns on GPUs); `kv_heads_tp` (more tp ranks than
# kv heads, 4 ranks on the GPUs, verified); `lse_gradient_tests` (a loss reading lse: GPU tests, the ring backward's
# over both transports), `lse_gradient_python` (the Python layer's CUDA tests, then its cost, bench/lse_gradient_cost.py); `varlen` (GPU tests, the ring
# backward's over both transports, the Python layer's CUDA tests; `varlen_python` the last alone), `varlen_bench` (attention_varlen beside PyTorch's varlen SDPA); `small_calls` (tests, then a small
# call's cost with and without this build's changes, switched by environment variables); `softcap_documents` (a soft cap
# beside segment ids: GPU tests, the CLI, the Python layer's), `softcap_bench` (its rows beside segments alone and the cap
# alone, mma.sync's too, and FlexAttention's); `staged_extras` (a mask alone staged in shared memory: GPU tests, the rings'
# mask cases, rows with and without a mask or a bias, FlexAttention's and SDPA's with a mask); `mask_tiles` (the mask
# instances' tile summary: GPU tests with a mask or a bias, the rings' mask cases, documents as a mask beside segment ids and FlexAttention's
# document block mask, a dense mask's rows); `mask_named` (a named mask's summary made once: the same tests, the Python layer's
# with a mask, documents as a mask summarised each call and named, beside segment ids and FlexAttention); `mend_tests` (the SASS
# check, the GPU tests whole), `mend_python` (the rings' tests on 2 ranks, the Python package's CUDA tests, the named mask's
# documents rows beside segment ids); several as a comma list. Logs go to $OUT.
#   bash .device/on-device.sh bash bench/gpu_session.sh BUILD STAGE[,STAGE...] [GPUS]
# BUILD: a build folder small enough to carry, or what bench/pack_for_device.sh makes of one (a build's
# statically linked programs are 47 MB each, past the carry's 64 MiB together).
set -u -o pipefail
build=${1:?build folder}; stage=${2:?check|bench|ring}; gpus=${3:-2}
out=${OUT:-/tmp/out}; mkdir -p "$out"
bin=$build/bin/ringattn
[ -f $build/pack.tar.xz ] && tar xJf $build/pack.tar.xz -C $build  # binaries packed to fit the carry limit
has() { [[ ",$stage," == *",$1,"* ]]; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | head -n "$gpus"
if has check; then
  # wgmma a warp may issue diverged (an illegal instruction at run time) in the build's SASS
  python3 bench/check_wgmma_convergence.py $(ls $build/lib/libra_core.so $build/attention/libra_attention.a 2>/dev/null | head -n 1) |
    tee "$out/wgmma_convergence.txt" | tail -n 3
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 25
  for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do
    mpirun -np $n $build/tests/ring_mpi_test --backend=cuda --gtest_brief=1 2>&1 | tee "$out/ring_cuda_$n.log" | tail -n 15
  done
  d=$(mktemp -d)
  $bin generate --output $d/in.h5 --batch 1 --seq 1024 --heads 8 --kv-heads 2 --head-dim 128 --dtype bf16 >/dev/null &&
  mpirun -np 2 $bin run --backend cuda --input $d/in.h5 --output $d/out.h5 --causal --layout zigzag &&
  $bin verify --input $d/in.h5 --output $d/out.h5 --causal; echo "cli round trip exit $?"
  if [ "$gpus" -ge 4 ]; then  # a 2-d mesh: the sp axis' NCCL communicator is split from the job's
    $bin generate --output $d/in2.h5 --batch 2 --seq 1024 --heads 8 --kv-heads 2 --head-dim 128 --dtype bf16 >/dev/null &&
    mpirun -np 4 $bin run --backend cuda --mesh dp=2,sp=2 --input $d/in2.h5 --output $d/out2.h5 --causal &&
    mpirun -np 4 $bin verify --mesh dp=2,sp=2 --input $d/in2.h5 --output $d/out2.h5 --causal; echo "cli dp=2,sp=2 exit $?"
  fi
fi
if has mesh_dropout; then  # dropout keyed by global batch / head on dp and tp meshes of GPUs; verify of the bf16 wire
  python3 bench/check_wgmma_convergence.py $(ls $build/lib/libra_core.so $build/attention/libra_attention.a 2>/dev/null | head -n 1) |
    tee "$out/wgmma_convergence.txt" | tail -n 3
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 8
  $build/tests/cuda_attention_test --gtest_filter='*slice_offsets*' 2>&1 | grep -E "^\[ +(OK|FAILED) " | tee "$out/slice_offsets.log"
  mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --gtest_brief=1 2>&1 | tee "$out/ring_backward_cuda_2.log" | tail -n 4
  d=$(mktemp -d)
  $bin generate --output $d/in.h5 --batch 2 --seq 777 --heads 8 --kv-heads 2 --head-dim 128 --dtype bf16 --with-grad >/dev/null
  for mesh in dp=2 tp=2; do
    for kernel in wgmma mma_sync; do
      mpirun -np 2 $bin run --backend cuda --impl flash_attn2 --mesh $mesh --flash-kernel $kernel --input $d/in.h5 \
        --output $d/$mesh-$kernel.h5 --causal --dropout 0.2 --backward --quiet &&
      mpirun -np 2 $bin verify --input $d/in.h5 --output $d/$mesh-$kernel.h5 --causal --dropout 0.2 | tail -n 4
      echo "dropout on $mesh ($kernel) exit $?"
    done
  done
  mpirun -np 2 $bin run --backend cuda --input $d/in.h5 --output $d/wire.h5 --causal --backward --grad-wire bf16 --quiet &&
    mpirun -np 2 $bin verify --input $d/in.h5 --output $d/wire.h5 --causal | tail -n 3; echo "bf16 wire verify exit $?"
  $bin verify --input $d/in.h5 --output $d/wire.h5 2>&1 | head -n 1; echo "verify without --causal exit $?"
fi
if has cli_sweep; then  # random generate -> run --backward -> verify round trips on the GPUs (tests/launch/cli_sweep.py)
  python3 tests/launch/cli_sweep.py $bin mpirun --backend cuda --count ${sweep_count:-40} --seed ${sweep_seed:-1} 2>&1 |
    tee "$out/cli_sweep_cuda.log" | grep -vE "^verified" | tail -n 40
fi
if has kv_heads_tp; then  # more tp ranks than kv heads on the GPUs (4 ranks on the GPUs): run --backward, then verify
  d=$(mktemp -d)
  $bin generate --output $d/mqa.h5 --batch 2 --seq 301 --heads 4 --kv-heads 1 --head-dim 64 --dtype bf16 --with-grad \
    --with-sinks >/dev/null
  $bin generate --output $d/gqa.h5 --seq 257 --heads 8 --kv-heads 2 --head-dim 128 --dtype f16 --with-grad >/dev/null
  for case in "mqa tp=2,sp=2" "mqa tp=4" "gqa tp=4" "gqa dp=1,tp=2,sp=2"; do
    set -- $case
    mpirun -np 4 --oversubscribe $bin run --backend cuda --input $d/$1.h5 --output $d/$1-$2.h5 --mesh $2 --causal --backward \
      --quiet 2>&1 | tail -n 2 | tee -a "$out/kv_heads_tp.log"
    mpirun -np 4 --oversubscribe $bin verify --input $d/$1.h5 --output $d/$1-$2.h5 --mesh $2 --causal 2>&1 | tail -n 6 |
      sed "s/^/$1 $2: /" | tee -a "$out/kv_heads_tp.log"
  done
fi
if has any_head_dim; then  # sdpa past 256 columns on the GPU, alone and as the ring's steps; cudnn's refusals
  $build/tests/cuda_attention_test --gtest_filter='*OptionsItCannotExpress*:*sdpa*D300*' 2>&1 | grep -E "^\[ +(OK|FAILED) "
  d=$(mktemp -d)
  $bin generate --output $d/wide.h5 --batch 1 --seq 333 --kv-seq 301 --heads 4 --kv-heads 2 --head-dim 300 --v-head-dim 264 \
    --dtype bf16 --with-grad --with-sinks >/dev/null
  mpirun -np 2 $bin run --backend cuda --local-impl sdpa --input $d/wide.h5 --output $d/wide-out.h5 --causal --backward --quiet &&
    $bin verify --input $d/wide.h5 --output $d/wide-out.h5 --causal | tail -n 4; echo "ring of sdpa at D 300 exit $?"
  mpirun -np 2 $bin run --backend cuda --input $d/wide.h5 --output $d/x.h5 --causal 2>&1 | head -n 1
fi
if has faults; then
  bash tests/launch/fault_test.sh $bin mpirun cuda 2>&1 | tee "$out/fault_cuda.log" | grep -E "^(ok|FAIL|skip)|passed"
fi
if has cudnn; then
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 12
  mpirun -np 2 $build/tests/ring_mpi_test --backend=cuda --gtest_brief=1 2>&1 | tee "$out/ring_cuda_2.log" | tail -n 12
fi
bench() {  # ranks, then bench options ($bin may be set for one call)
  local n=$1; shift
  mpirun -np $n $bin bench --backend cuda --batch 1 --heads "${heads:-32}" --head-dim "${head_dim:-128}" --dtype bf16 --warmup "${warmup:-2}" "$@" 2>&1 | grep -v '^#' | tee -a "$out/bench.txt"
}
ring_tests_both_transports() {  # the GPU ring's forward and backward tests on 2 GPUs, over copy engines and over NCCL
  local tr t
  for tr in copy-engines nccl; do
    for t in ring_mpi_test ring_backward_mpi_test; do
      timeout 200 mpirun -np 2 $build/tests/$t --backend=cuda --transport=$tr --gtest_brief=1 2>&1 |
        tee "$out/${t}_2gpu_$tr.log" | grep -v "^\[  SKIPPED\|runs on the host\|^\s*$" | tail -n 4
    done
  done
}
million_tokens() {  # forward + backward of 1M tokens causal on 2 GPUs (time, TFLOP/s, memory), each local kernel named
  local kernel
  for kernel in "$@"; do
    echo "# $kernel steps" | tee -a "$out/million.txt"
    timeout 300 mpirun -np 2 $bin bench --backward --backend cuda --impl ring --local-impl $kernel --batch 1 --heads 32 \
      --head-dim 128 --dtype bf16 --seq 1048576 --causal --layout zigzag --warmup 0 --iters 1 2>&1 | tee -a "$out/million.txt"
  done
}
mask_tests() {  # cuda_attention_test's tests matching $1 (none where empty), then the rings' matching $2 (2 ranks on the
  # GPU; none where empty); $tests_timeout and $ring_timeout bound each run
  local t
  [ -z "$1" ] || timeout ${tests_timeout:-200} $build/tests/cuda_attention_test --gtest_brief=1 --gtest_filter="$1" 2>&1 |
    tee "$out/cuda_attention_test.log" | tail -n 8
  [ -n "$2" ] || return 0
  for t in ring_mpi_test ring_backward_mpi_test; do
    timeout ${ring_timeout:-100} mpirun -np 2 $build/tests/$t --backend=cuda --gtest_brief=1 --gtest_filter="$2" 2>&1 |
      tee "$out/$t.log" | grep -v "^\[  SKIPPED\|^\s*$" | tail -n 4
  done
}
documents_rows() {  # bench --backward at bench/torch_documents.py's shapes (H=16 D=128 T=32768; 16 and 64 documents,
  # causal or not), once for each way of handing the documents over in "$@" ("": segment ids)
  local docs causal how
  for docs in 16 64; do
    for causal in "" "--causal"; do
      for how in "$@"; do
        echo "# $docs documents $causal ${how:-as segment ids}" | tee -a "$out/bench.txt"
        heads=16 head_dim=128 bench 1 --backward --impl flash_attn2 --seq 32768 --iters 10 --segments $docs $how $causal
      done
    done
  done
}
unit_tests() {  # cuda_attention_test, unless no_tests=1 (a call after one that tested this build)
  [ -n "${no_tests:-}" ] || $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 8
}
# One GPU's `bench --backward` (forward and backward rows) with binary $1 at T = 32768 for each shape of $shapes
# (H x D, or H x D x Dv), under each flag set after $1: a line per row.
rows_by_shape() {
  local rows_bin=$1 flags shape h d dv
  shift
  for flags in "$@"; do
    for shape in $shapes; do
      IFS=x read -r h d dv <<< "$shape"
      echo -n "H=$h D=$d ${dv:+Dv=$dv }$flags: " | tee -a "$out/bench.txt"
      bin=$rows_bin heads=$h head_dim=$d bench 1 --backward --impl flash_attn2 --seq 32768 --iters 6 ${dv:+--v-head-dim $dv} \
        $flags | tr '\n' ' '
      echo | tee -a "$out/bench.txt"
    done
  done
}
# Calls the function $1 with this build's ringattn and then each variant (build/variants/ringattn_*, or
# the ones matching $variants; unpacked from variants.tar.xz when it came along), $rounds rounds (2), each run
# under a header line: the builds interleave, so drift between them shows as a difference of rounds.
for_each_build() {
  [ -f $build/variants.tar.xz ] && tar xJf $build/variants.tar.xz -C $build
  local round b
  for round in $(seq "${rounds:-2}"); do
    for b in $bin $build/variants/${variants:-ringattn_*}; do
      [ -x "$b" ] || continue
      echo "# $(basename $b), round $round" | tee -a "$out/bench.txt"
      "$1" "$b"
    done
  done
}
if has priority; then  # the ring with its NCCL stream at the greatest priority (bin) and at the default (variant)
  for t in 32768 131072; do
    bench 1 --impl flash_attn2 --seq $t --iters 10
    bench 1 --impl flash_attn2 --seq $t --iters 10 --causal
    for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do
      for causal in "" "--causal --layout zigzag"; do
        for b in $bin $build/variants/ringattn_normal_priority; do
          echo "# $(basename $b)" | tee -a "$out/bench.txt"
          bin=$b bench $n --impl ring --seq $t --iters 10 $causal
        done
      done
    done
  done
  bench 1 --impl flash_attn2 --seq 8192 --iters 10
  bench 1 --impl flash_attn2 --seq 8192 --iters 10 --causal
fi
if has probe; then  # where the ring loses time against its local kernel on the same per-step shape
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw --format=csv,noheader -lms 200 > "$out/smi.csv" &
  smi=$!
  phase() { echo "# $(date +%T.%N | cut -c1-12) $*" | tee -a "$out/bench.txt"; }
  phase "1 GPU flash_attn2 T=65536"; bench 1 --impl flash_attn2 --seq 65536 --iters 5
  phase "1 GPU ring (no exchange) T=65536"; bench 1 --impl ring --seq 65536 --iters 5
  phase "2 GPUs ring T=131072"; bench 2 --impl ring --seq 131072 --iters 5
  phase "2 GPUs ring T=131072 no checksums"; bench 2 --impl ring --seq 131072 --iters 5 --no-block-checksums
  phase "4 single-GPU flash_attn2 T=65536 at once"
  pids=()
  for g in $(seq 0 $((gpus - 1))); do
    CUDA_VISIBLE_DEVICES=$g mpirun -np 1 $bin bench --backend cuda --batch 1 --heads 32 --head-dim 128 --dtype bf16 \
      --warmup 2 --iters 5 --impl flash_attn2 --seq 65536 2>&1 | grep -v '^#' > "$out/at_once_$g.txt" &
    pids+=($!)
  done
  wait "${pids[@]}"; cat "$out"/at_once_*.txt | tee -a "$out/bench.txt"
  phase "4 GPUs ring T=32768"; bench 4 --impl ring --seq 32768 --iters 10
  phase "1 GPU flash_attn2 T=8192"; bench 1 --impl flash_attn2 --seq 8192 --iters 10
  phase "1 GPU ring (no exchange) T=8192"; bench 1 --impl ring --seq 8192 --iters 10
  phase end; kill $smi
fi
if has steps; then  # per-step device times of the ring (kernels, exchanges, gaps) at small and mid blocks
  bench 1 --impl flash_attn2 --seq 8192 --iters 10
  bench 1 --impl flash_attn2 --seq 8192 --iters 10 --causal
  for causal in "" "--causal --layout zigzag"; do
    bench 4 --impl ring --seq 32768 --iters 10 $causal --step-times
    bench 2 --impl ring --seq 32768 --iters 10 $causal --step-times
  done
fi
if has outside; then  # where the ring's time goes outside its kernels: every rank's own times (--step-times), one GPU as a ring of 1, the kernel chains of all ranks
  for round in 1 2; do
    bench 1 --impl flash_attn2 --seq 32768 --iters 10 --causal
    bench 1 --impl ring --seq 32768 --iters 10 --causal --step-times
    bench "$gpus" --impl ring --seq 32768 --iters 10 --causal --layout zigzag
    bench "$gpus" --impl ring --seq 32768 --iters 10 --causal --layout zigzag --step-times
    bench "$gpus" --impl ring --seq 32768 --iters 10 --causal --layout zigzag --step-times --no-block-checksums
  done
  for r in $(seq 0 $((gpus - 1))); do
    $build/bin/ring_chain_gpu_bench --ranks "$gpus" --rank $r --seq 32768 --causal --iters 15 2>&1 | tee -a "$out/chain.txt"
  done
fi
if has contention; then  # what the ring's side work costs its kernels: block checksums on and off, this build against the variants
  contention_rows() {
    bin=$1 bench 1 --impl flash_attn2 --seq 32768 --iters 10 --causal
    for checks in "" "--no-block-checksums"; do
      bin=$1 bench "$gpus" --impl ring --seq 32768 --iters 10 --causal --layout zigzag $checks
    done
    bin=$1 bench "$gpus" --impl ring --seq 32768 --iters 10
  }
  for_each_build contention_rows
fi
if has ctas; then  # NCCL's send/recv kernels take SMs from the attention: fewer CTAs, larger chunks (4 GPUs)
  for causal in "" "--causal"; do bench 1 --impl flash_attn2 --seq 32768 --iters 10 $causal; done
  for setting in default NCCL_MAX_CTAS=4 NCCL_MAX_CTAS=8 NCCL_MAX_CTAS=16 "NCCL_MAX_CTAS=4 NCCL_P2P_NVL_CHUNKSIZE=2097152" \
                 "NCCL_MAX_CTAS=8 NCCL_P2P_NVL_CHUNKSIZE=2097152" NCCL_P2P_NVL_CHUNKSIZE=2097152; do
    echo "# NCCL setting: $setting" | tee -a "$out/bench.txt"
    for causal in "" "--causal --layout zigzag"; do
      ( [ "$setting" != default ] && export $setting; bench 4 --impl ring --seq 32768 --iters 10 $causal )
    done
  done
fi
if has transport; then  # the ring's two transports: checks, then side by side in one call
  for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do
    for t in copy-engines nccl; do
      echo "# ring_mpi_test on $n GPUs, transport $t"
      mpirun -np $n $build/tests/ring_mpi_test --backend=cuda --transport=$t --gtest_brief=1 2>&1 | tee "$out/ring_${t}_$n.log" | tail -n 6
    done
  done
  d=$(mktemp -d)
  $bin generate --output $d/in.h5 --batch 1 --seq 4096 --heads 8 --kv-heads 2 --head-dim 128 --dtype bf16 >/dev/null &&
  mpirun -np "$gpus" $bin run --backend cuda --ring-transport copy-engines --input $d/in.h5 --output $d/out.h5 --causal &&
  $bin verify --input $d/in.h5 --output $d/out.h5 --causal; echo "cli round trip (copy engines, $gpus GPUs) exit $?"
  rm -rf "$d"
  for causal in "" "--causal"; do bench 1 --impl flash_attn2 --seq 32768 --iters 10 $causal; done
  for t in 32768 65536; do
    for causal in "" "--causal --layout zigzag"; do
      for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do
        for tr in nccl copy-engines; do bench $n --impl ring --seq $t --iters 10 --ring-transport $tr $causal; done
      done
    done
  done
fi
if has ratio; then  # kernel check, then the issue-4 ratio rows at 8192 tokens per GPU in one call
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 4
  for t in 32768 8192; do for causal in "" "--causal"; do bench 1 --impl flash_attn2 --seq $t --iters 10 $causal; done; done
  for causal in "" "--causal --layout zigzag"; do
    for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do bench $n --impl ring --seq 32768 --iters 10 $causal; done
  done
  [ "$gpus" -ge 4 ] && bench 4 --impl ring --seq 32768 --iters 10 --causal --layout zigzag --ring-transport nccl
fi
if has ab; then  # the built binary (bin) against build/variants/ringattn_before_*, interleaved in one call
  ab_rows() {
    for t in 32768 8192; do for causal in "" "--causal"; do bin=$1 bench 1 --impl flash_attn2 --seq $t --iters 10 $causal; done; done
    for causal in "" "--causal --layout zigzag"; do bin=$1 bench "$gpus" --impl ring --seq 32768 --iters 10 $causal; done
  }
  variants='ringattn_before_*' for_each_build ab_rows
fi
if has versus; then  # this build's ringattn and every variants/ringattn_* (or the variants.tar.xz they travel in), in turn per round
  ring_seqs=${ring_seqs:-32768}  # global T of the causal ring rows, e.g. ring_seqs="16384 32768"
  versus_rows() {
    for t in $(printf '%s\n' 32768 8192 $ring_seqs | sort -nu); do
      for causal in "" "--causal"; do bin=$1 bench 1 --impl flash_attn2 --seq $t --iters 10 $causal; done
    done
    for t in $ring_seqs; do bin=$1 bench "$gpus" --impl ring --seq $t --iters 10 --causal --layout zigzag; done
  }
  for_each_build versus_rows
fi
if has aim; then  # issue 4's cells at 8192 and 16384 tokens per GPU on the GPUs lent: one GPU and the ring, causal and not, this build and every variant, interleaved
  aim_rows() {
    for t in $((8192 * gpus)) $((16384 * gpus)); do
      for causal in "" "--causal --layout zigzag"; do
        bin=$1 bench 1 --impl flash_attn2 --seq $t --iters 10 $causal
        bin=$1 bench "$gpus" --impl ring --seq $t --iters 10 $causal
      done
    done
  }
  for_each_build aim_rows
fi
if has chain; then  # the ring's kernels on one GPU without transfers (bin/ring_chain_gpu_bench), serial and overlapped
  for args in "--ranks 4 --seq 32768 --causal" "--ranks 4 --rank 3 --seq 32768 --causal" "--ranks 4 --seq 32768" \
              "--ranks 2 --seq 16384 --causal" "--ranks 4 --seq 131072 --causal"; do
    $build/bin/ring_chain_gpu_bench $args --iters 15 2>&1 | tee -a "$out/chain.txt"
  done
fi
if has checksums; then  # what the block checksums cost the ring at 8192 tokens per GPU: this build and the variants, with and without them
  bench 1 --impl flash_attn2 --seq 32768 --iters 10 --causal
  checksum_rows() {
    for causal in "--causal --layout zigzag" ""; do
      for checks in "" "--no-block-checksums"; do bin=$1 bench "$gpus" --impl ring --seq 32768 --iters 10 $causal $checks; done
    done
  }
  for_each_build checksum_rows
fi
if has scaling; then  # issue 7's rows on the GPUs lent: one GPU, then the ring on 2 and 4 GPUs, same call
  for t in 65536 262144; do
    for causal in "" "--causal"; do bench 1 --impl flash_attn2 --seq $t --iters 5 $causal; done
    for causal in "" "--causal --layout zigzag"; do
      for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do bench $n --impl ring --seq $t --iters 5 $causal; done
    done
  done
  # million=ring4 (env): only the 1M-token causal ring on 4 GPUs (a call's time limit holds the rest back)
  [ "${million:-all}" = all ] && warmup=1 bench 1 --impl flash_attn2 --seq 1048576 --iters 1 --causal
  for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do
    [ "${million:-all}" = ring4 ] && [ "$n" != 4 ] && continue
    warmup=1 bench $n --impl ring --seq 1048576 --iters 2 --causal --layout zigzag
    [ "${million:-all}" = all ] && warmup=1 bench $n --impl ring --seq 1048576 --iters 1
  done
fi
if has wide; then  # head_dim 256 (the mma.sync kernel): one GPU, then the ring on 4 GPUs
  for t in 8192 32768; do
    for causal in "" "--causal"; do head_dim=256 bench 1 --impl flash_attn2 --seq $t --iters 10 $causal; done
  done
  [ "$gpus" -ge 4 ] && for causal in "" "--causal --layout zigzag"; do head_dim=256 bench 4 --impl ring --seq 32768 --iters 10 $causal; done
fi
if has tables; then  # the ratio rows of issue 4 in one call: one GPU, then the ring on 2 and 4 GPUs
  for causal in "" "--causal"; do bench 1 --impl flash_attn2 --seq 32768 --iters 10 $causal; done
  for causal in "" "--causal --layout zigzag"; do
    for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do bench $n --impl ring --seq 32768 --iters 10 $causal; done
    [ "$gpus" -ge 4 ] && bench 4 --impl ring --seq 65536 --iters 10 $causal
    [ "$gpus" -ge 4 ] && bench 4 --impl ring --seq 131072 --iters 5 $causal
  done
fi
if has staging; then  # HDF5 -> host -> GPU and back, pinned against pageable host memory, 4 ranks
  d=$(mktemp -d)
  $bin generate --output $d/big.h5 --batch 1 --seq 65536 --heads 32 --head-dim 128 --dtype bf16 >/dev/null
  for mode in "" --pageable "" --pageable; do
    rm -f $d/o.h5
    mpirun -np "$gpus" $bin run --backend cuda --input $d/big.h5 --output $d/o.h5 $mode 2>&1 | tee -a "$out/staging.txt"
  done
  rm -rf "$d"
fi
if has hardening; then  # issue 19 on GPUs: kernel tests, the ring over both transports (D=128, uneven shards), faults, CLI
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 25
  for transport in auto nccl; do
    mpirun -np 2 $build/tests/ring_mpi_test --backend=cuda --transport=$transport --gtest_brief=1 2>&1 |
      tee "$out/ring_cuda_2_$transport.log" | tail -n 8
  done
  bash tests/launch/fault_test.sh $bin mpirun cuda 2>&1 | tee "$out/fault_cuda.log" | grep -E "^(ok|FAIL|skip)|passed"
  d=$(mktemp -d)
  $bin generate --output $d/odd.h5 --batch 1 --seq 1001 --heads 8 --kv-heads 2 --head-dim 128 --dtype bf16 >/dev/null
  for local_impl in flash_attn2 cudnn; do
    for transport in auto nccl; do
      mpirun -np 2 $bin run --backend cuda --local-impl $local_impl --ring-transport $transport --input $d/odd.h5 \
        --output $d/odd_out.h5 --causal --overwrite --quiet && $bin verify --input $d/odd.h5 --output $d/odd_out.h5 --causal |
        sed "s/^/T=1001 on 2 GPUs, $local_impl, $transport: /"
    done
  done
  rm -rf "$d"
fi
if has million2; then  # the 1M-token regression on 2 GPUs (8 GiB K/V blocks): both kernels, both transports
  for transport in auto nccl; do warmup=1 bench 2 --impl ring --seq 1048576 --iters 1 --causal --ring-transport $transport; done
  warmup=1 bench 2 --impl ring --local-impl cudnn --seq 1048576 --iters 1 --causal
fi
if has readme; then  # the README's performance table, 2-GPU rows, in one call
  for t in 32768 131072; do
    for causal in "" "--causal"; do
      bench 1 --impl cudnn --seq $t --iters 10 $causal
      bench 1 --impl flash_attn2 --seq $t --iters 10 $causal
    done
    for causal in "" "--causal --layout zigzag"; do
      bench 2 --impl ring --local-impl cudnn --seq $t --iters 10 $causal
      bench 2 --impl ring --seq $t --iters 10 $causal
    done
  done
  for causal in "" "--causal"; do  # head_dim 256: cudnn (as the installed cuDNN allows) next to flash_attn2
    heads=16 head_dim=256 bench 1 --impl cudnn --seq 32768 --iters 10 $causal
    heads=16 head_dim=256 bench 1 --impl flash_attn2 --seq 32768 --iters 10 $causal
  done
fi
if has bench; then
  for t in 8192 32768 131072; do
    for causal in "" "--causal"; do
      bench 1 --impl flash_attn2 --seq $t --iters 10 $causal
    done
  done
  bench 1 --impl sdpa --seq 8192 --iters 3
  bench 1 --impl sdpa --seq 8192 --iters 3 --causal
fi
if has cudnn; then
  for causal in "" "--causal"; do bench 1 --impl cudnn --seq 32768 --iters 10 $causal; done
  for causal in "" "--causal --layout zigzag"; do
    bench 2 --impl ring --local-impl cudnn --seq 32768 --iters 10 $causal
    bench 2 --impl ring --local-impl cudnn --seq 131072 --iters 5 $causal
  done
fi
if has ring; then
  for t in 8192 32768 131072; do
    for causal in "" "--causal --layout zigzag"; do
      for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do bench $n --impl ring --seq $t --iters 10 $causal; done
    done
  done
  if [ "$gpus" -ge 4 ]; then
    bench 4 --impl ring --seq 262144 --iters 3 --causal --layout zigzag
    bench 4 --impl ring --seq 1048576 --iters 2 --causal --layout zigzag
  fi
fi
if has kernels; then  # the two flash kernels on the same shapes in one call: single GPU, then the ring
  for d in 128 64; do
    for t in 8192 32768; do
      for causal in "" "--causal"; do
        for k in mma_sync wgmma; do
          echo "# --flash-kernel $k head_dim=$d" | tee -a "$out/bench.txt"
          head_dim=$d bench 1 --impl flash_attn2 --flash-kernel $k --seq $t --iters 10 $causal
        done
      done
    done
  done
  for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do
    for causal in "" "--causal --layout zigzag"; do
      for k in mma_sync wgmma; do
        echo "# --flash-kernel $k" | tee -a "$out/bench.txt"
        bench $n --impl ring --flash-kernel $k --seq 32768 --iters 10 $causal
      done
    done
  done
fi
if has causal; then  # the causal rows only (single GPU, ring on 2 and 4 GPUs, 1M tokens on 4)
  for t in 32768 131072; do
    bench 1 --impl flash_attn2 --seq $t --iters 10 --causal
    for n in 2 $( [ "$gpus" -ge 4 ] && echo 4 ); do bench $n --impl ring --seq $t --iters 10 --causal --layout zigzag; done
  done
  [ "$gpus" -ge 4 ] && bench 4 --impl ring --seq 1048576 --iters 2 --causal --layout zigzag
fi
# CLI round trips of the backward: generate --with-grad, then run --backward with each impl of $1 and
# each mask after it (full or --causal), verified against the f64 reference.
backward_cli() {
  local d impl mask causal
  d=$(mktemp -d)
  $bin generate --output $d/g.h5 --batch 1 --seq 1001 --heads 8 --kv-heads 2 --head-dim ${cli_head_dim:-128} --dtype bf16 \
    --with-grad >/dev/null
  for impl in $1; do
    for mask in "${@:2}"; do
      causal=${mask#full}
      $bin run --backend cuda --impl $impl --input $d/g.h5 --output $d/g_$impl.h5 --backward --quiet --overwrite $causal &&
      $bin verify --input $d/g.h5 --output $d/g_$impl.h5 $causal | tee -a "$out/backward_cli.txt"; echo "cli --backward $impl $causal exit $?"
    done
  done
}
if has backward; then  # issue 20: the backward's GPU tests, CLI round trips, then ours and PyTorch's side by side
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 40
  backward_cli "flash_attn2 cudnn sdpa" --causal
  backward_bench() {  # impl, heads, head_dim, seq, causal flag
    $bin bench --backward --backend cuda --impl $1 --batch 1 --heads $2 --head-dim $3 --seq $4 --dtype bf16 --warmup 2 \
      --iters 10 $5 2>&1 | tee -a "$out/backward_bench.txt"
  }
  for causal in "" "--causal"; do
    for shape in "32 128" "64 64"; do
      for impl in flash_attn2 cudnn; do backward_bench $impl $shape 32768 "$causal"; done
    done
    for impl in flash_attn2 cudnn; do backward_bench $impl 16 256 32768 "$causal"; done
  done
  python3 bench/torch_backward.py 2>&1 | tee "$out/torch_backward.txt"
fi
if has backward_ab; then  # the flash backward of this build and of each variant, interleaved
  flash_backward_rows() {
    local b=$1 causal shape
    for causal in "" "--causal"; do
      for shape in "32 128" "64 64"; do
        $b bench --backward --backend cuda --impl flash_attn2 --batch 1 --heads ${shape% *} --head-dim ${shape#* } \
          --seq 32768 --dtype bf16 --warmup 2 --iters 10 $causal 2>&1 | grep -v '^#' | tee -a "$out/bench.txt"
      done
    done
  }
  for_each_build flash_backward_rows
fi
if has backward_kernels; then  # the two flash backward kernels (wgmma, mma.sync) interleaved, beside PyTorch's
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 30
  backward_cli flash_attn2 full --causal
  for round in 1 2; do
    for causal in "" "--causal"; do
      for shape in "32 128" "64 64"; do
        for kernel in auto mma_sync; do  # auto: wgmma where it runs (the forward at head_dim 256: mma_sync)
          echo -n "round $round kernel $kernel: " | tee -a "$out/backward_bench.txt"
          $bin bench --backward --backend cuda --impl flash_attn2 --flash-kernel $kernel --batch 1 --heads ${shape% *} \
            --head-dim ${shape#* } --seq 32768 --dtype bf16 --warmup 2 --iters 10 $causal 2>&1 | grep -v '^#' | tee -a "$out/backward_bench.txt"
        done
      done
    done
  done
  python3 bench/torch_backward.py 32x128 64x64 2>&1 | tee "$out/torch_backward.txt"
fi
if has wide_backward; then  # issue 20: head_dim 256 in the flash backward: GPU tests, CLI round trips, the ring
  # on 2 ranks (sharing the GPU where one), then both kernels' rows of this build and the variants, beside PyTorch's
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 30
  timeout 300 mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --gtest_brief=1 2>&1 |
    tee "$out/ring_backward_cuda_2.log" | grep -v "^\[  SKIPPED" | tail -n 12
  cli_head_dim=256 backward_cli "flash_attn2 cudnn" full --causal
  flash_kernel_rows() {
    local b=$1 causal shape kernel
    for causal in "" "--causal"; do
      for shape in "16 256" "32 128" "64 64"; do
        for kernel in auto mma_sync; do  # auto: wgmma where it runs (the forward at head_dim 256: mma_sync)
          echo -n "$kernel: " | tee -a "$out/bench.txt"
          $b bench --backward --backend cuda --impl flash_attn2 --flash-kernel $kernel --batch 1 --heads ${shape% *} \
            --head-dim ${shape#* } --seq 32768 --dtype bf16 --warmup 2 --iters 10 $causal 2>&1 | grep "backward \|error" |
            tee -a "$out/bench.txt"
        done
      done
    done
  }
  for_each_build flash_kernel_rows
  for causal in "" "--causal"; do
    $bin bench --backward --backend cuda --impl cudnn --batch 1 --heads 16 --head-dim 256 --seq 32768 --dtype bf16 \
      --warmup 2 --iters 10 $causal 2>&1 | grep -v '^#' | tee -a "$out/bench.txt"
  done
  python3 bench/torch_backward.py 32x128 64x64 16x256 2>&1 | tee "$out/torch_backward.txt"
fi
if has ring_backward; then  # issue 21: the GPU ring's backward (quick=1: without the kernel tests and the
  # ring of one's timings; faults=1: with the fault cases)
  [ -z "${quick:-}" ] && $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 4
  for n in 2 4; do
    timeout 300 mpirun -np $n $build/tests/ring_mpi_test --backend=cuda --gtest_brief=1 2>&1 | tee "$out/ring_cuda_$n.log" |
      grep -v "Skipped\|runs on the host\|^\s*$" | tail -n 6
  done
  for n in 1 2 3 4; do
    timeout 150 mpirun -np $n $build/tests/ring_backward_mpi_test --backend=cuda --gtest_brief=1 2>&1 |
      tee "$out/ring_backward_cuda_$n.log" | grep -v "^\[  SKIPPED" | tail -n 12
  done
  [ -n "${faults:-}" ] && bash tests/launch/fault_test.sh $bin mpirun cuda 2>&1 | tee "$out/fault_cuda.log" | grep -E "^(ok|FAIL)|^\[rank|error" | head -n 80
  d=$(mktemp -d)
  $bin generate --output $d/g.h5 --batch 1 --seq 1001 --heads 8 --kv-heads 2 --head-dim 128 --dtype bf16 --with-grad >/dev/null
  for args in "-np 2 --layout zigzag --causal" "-np 3 --layout contiguous" "-np 2 --layout zigzag --causal --local-impl cudnn"; do
    np=${args#-np }; np=${np%% *}; opts=${args#-np $np }
    causal=$( [[ "$opts" == *--causal* ]] && echo --causal )
    timeout 120 mpirun -np $np $bin run --backend cuda --impl ring $opts --input $d/g.h5 --output $d/r.h5 --backward --quiet --overwrite &&
    $bin verify --input $d/g.h5 --output $d/r.h5 $causal | tail -n 3; echo "cli ring --backward ($args) exit $?"
  done
  impls=("--impl flash_attn2" "--impl ring --local-impl flash_attn2" "--impl cudnn" "--impl ring --local-impl cudnn")
  [ -n "${quick:-}" ] && impls=()
  for causal in "" "--causal"; do  # the ring of one rank against its local kernel
    for impl in "${impls[@]}"; do
      $bin bench --backward --backend cuda $impl --batch 1 --heads 32 --head-dim 128 --seq 32768 --dtype bf16 --warmup 2 \
        --iters 10 $causal 2>&1 | grep -v "^#" | tee -a "$out/backward_bench.txt"
    done
  done
fi
if has ring_memory; then  # issue 21: the ring backward's peak device memory per rank (2 ranks; on one GPU they share it, so times mean nothing there)
  for local in cudnn flash_attn2; do
    for causal in "" "--causal --layout zigzag"; do
      timeout 200 mpirun -np 2 $bin bench --backward --backend cuda --impl ring --local-impl $local --batch 1 --heads 32 \
        --head-dim 128 --seq 32768 --dtype bf16 --warmup 1 --iters 2 $causal 2>&1 | grep -v "^#\|note:" | tee -a "$out/ring_memory.txt"
    done
  done
fi
# `python` needs, beside the pack, the module built here for the device image's Python 3.12 (configure the
# build with -DPython_EXECUTABLE=<a python3.12>) and .device/wheels: mpi4py built against Debian's Open MPI
# (`python3.12 -m pip wheel --no-deps -w .device/wheels mpi4py==4.0.3`; 3.1.4 no longer builds) and pytest's
# wheels (`pip download -d .device/wheels pytest`).
py=${RA_DEVICE_PYTHON:-python3}
python_package() {  # the module and the wheels (mpi4py for our Open MPI, pytest) on PYTHONPATH
  $py -m pip install -q --no-deps --target /tmp/pylib .device/wheels/*.whl 2>&1 | tail -n 2
  export PYTHONPATH=$build/python:/tmp/pylib
}
# examples/train_ring.py on the GPU ring, against one process's SDPA (the launcher's words come first)
train_cuda=(examples/train_ring.py --device cuda --dtype bf16 --seq 2048 --dim 256 --heads 4 --batch 2 --steps 200
            --lr 1.0 --tolerance 5e-2)
if has python; then  # issue 22: the Python package on CUDA tensors (tests, then its cost beside the C++ bench)
  python_package
  $py -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())"
  timeout 300 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py python/tests/test_jax_cuda.py 2>&1 |
    tee "$out/python_cuda.log" | tail -n 40
  timeout 300 mpirun -np 2 -x PYTHONPATH $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda_ring.py 2>&1 |
    tee "$out/python_cuda_ring.log" | tail -n 40
  timeout 300 $py -m pytest -q -p no:cacheprovider python/tests/test_core.py python/tests/test_torch.py 2>&1 | tail -n 3
  # ranks share the GPU where there are fewer
  timeout 300 mpirun -np 2 -x PYTHONPATH $py "${train_cuda[@]}" --csv "$out/train_ring_cuda.csv"; echo "train_ring cuda exit $?"
  for causal in 0 1; do
    timeout 300 $py bench/python_overhead.py $bin --cuda --seq 32768 --heads 32 --head-dim 128 --iters 10 --causal $causal 2>&1 |
      tee -a "$out/python_overhead.txt"
  done
fi
if has cache; then  # the device cache of call temporaries: GPU tests, then bench --backward against the variants
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 12
  for t in ring_mpi_test ring_backward_mpi_test; do  # ranks share the GPU where there are fewer
    timeout 150 mpirun -np 2 $build/tests/$t --backend=cuda --gtest_brief=1 2>&1 | tee "$out/${t}_cuda.log" |
      grep -v "^\[  SKIPPED\|runs on the host\|^\s*$" | tail -n 4
  done
  python_package
  timeout 300 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py python/tests/test_core.py 2>&1 |
    tee "$out/python_cuda.log" | tail -n 6
  cache_rows() {  # forward() and backward() per call, where the temporaries are allocated
    local b=$1 shape local
    for shape in "8192 " "32768 " "32768 --causal"; do
      for local in cudnn flash_attn2; do bin=$b bench 1 --backward --impl $local --seq ${shape% *} --iters 10 ${shape#* }; done
    done
  }
  for_each_build cache_rows
  for shape in "8192 " "32768 " "32768 --causal"; do  # the forward with its carry allocated once, for reference
    for local in cudnn flash_attn2; do bench 1 --impl $local --seq ${shape% *} --iters 10 ${shape#* }; done
  done
  for causal in 0 1; do
    timeout 300 $py bench/python_overhead.py $bin --cuda --seq 32768 --heads 32 --head-dim 128 --iters 10 --causal $causal 2>&1 |
      tee -a "$out/python_overhead.txt"
  done
  timeout 300 $py bench/python_overhead.py $bin --cuda --seq 4096 --heads 32 --head-dim 128 --iters 20 --causal 1 2>&1 |
    tee -a "$out/python_overhead.txt"
fi
if has two_gpus; then  # issues 21 / 22: speed per GPU on 2 GPUs (a GPU per rank)
  for t in 16384 32768; do
    for causal in "" "--causal"; do
      for local in cudnn flash_attn2; do
        bench 1 --backward --impl $local --seq $t --iters 10 $causal
        bench 2 --backward --impl ring --local-impl $local --seq $t --iters 10 $causal ${causal:+--layout zigzag}
      done
    done
  done
  for local in cudnn flash_attn2; do  # the bf16 grad wire beside the f32 one
    for wire in f32 bf16; do bench 2 --backward --impl ring --local-impl $local --seq 16384 --iters 10 --causal --grad-wire $wire; done
  done
  timeout 240 python3 -m torch.distributed.run --nproc-per-node 2 bench/torch_context_parallel.py --seqs 16384 32768 2>&1 |
    grep -v "^W\|^\s*warnings.warn\|UserWarning" | tee -a "$out/context_parallel.txt"
  python_package
  for round in 1 2; do  # the Python ring (kept rings) beside the C++ bench, alternating which goes first
    [ $round = 2 ] && bench 2 --backward --impl ring --seq 32768 --iters 10 --causal --layout zigzag
    timeout 120 mpirun -np 2 -x PYTHONPATH $py bench/python_ring_overhead.py --seqs 32768 --iters 10 2>&1 |
      tee -a "$out/python_ring_2gpu.txt"
    [ $round = 1 ] && bench 2 --backward --impl ring --seq 32768 --iters 10 --causal --layout zigzag
  done
  nvidia-smi --query-gpu=memory.used --format=csv
  million_tokens cudnn
fi
if has two_gpus_tests; then  # issues 21 / 22: correctness on 2 GPUs, both transports
  ring_tests_both_transports
  bash tests/launch/fault_test.sh $bin mpirun cuda 2>&1 | tee "$out/fault_cuda.log" | grep -E "^(ok|FAIL)|^\[rank|error" | head -n 60
  python_package
  timeout 300 mpirun -np 2 -x PYTHONPATH $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda_ring.py \
    2>&1 | tee "$out/python_cuda_ring.log" | tail -n 5
  timeout 300 mpirun -np 2 -x PYTHONPATH $py "${train_cuda[@]}" --csv "$out/train_ring_cuda_2gpu.csv" \
    --png "$out/train_ring_cuda_2gpu.png" 2>&1 | tail -n 4; echo "train_ring cuda 2 GPUs exit $?"
  # Under torchrun: the group carries an NCCL communicator's unique id (ringattn.NcclComm), no MPI.
  timeout 300 $py -m torch.distributed.run --standalone --nproc-per-node 2 -m pytest -q -rs -p no:cacheprovider \
    python/tests/test_torch_cuda_torchrun.py 2>&1 | tee "$out/python_cuda_torchrun.log" | tail -n 5
  timeout 300 $py -m torch.distributed.run --standalone --nproc-per-node 2 "${train_cuda[@]}" \
    --png "$out/train_ring_cuda_torchrun.png" 2>&1 | tail -n 4; echo "train_ring cuda torchrun exit $?"
fi
if has documents; then  # packed documents: the kernels skip blocks that share no segment
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 30
  timeout 300 mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --gtest_brief=1 2>&1 |
    tee "$out/ring_backward_cuda_2.log" | grep -v "^\[  SKIPPED" | tail -n 8
  dense_rows() {  # the rows without documents, this build against the variants
    local b=$1 causal shape impl
    for causal in "" "--causal"; do
      for shape in "16 128" "32 64"; do
        for impl in flash_attn2 $( [ "$shape" = "16 128" ] && echo cudnn ); do
          $b bench --backward --backend cuda --impl $impl --batch 1 --heads ${shape% *} --head-dim ${shape#* } \
            --seq 32768 --dtype bf16 --warmup 2 --iters 10 $causal 2>&1 | grep "forward \|backward \|error" | tee -a "$out/bench.txt"
        done
      done
    done
  }
  for_each_build dense_rows
  for docs in 16 64; do
    for causal in "" "--causal"; do
      for kernel in auto mma_sync; do
        echo "# documents $docs $causal $kernel" | tee -a "$out/documents.txt"
        $bin bench --backward --backend cuda --impl flash_attn2 --flash-kernel $kernel --batch 1 --heads 16 --head-dim 128 \
          --seq 32768 --dtype bf16 --warmup 2 --iters 10 --segments $docs $causal 2>&1 | grep "forward \|backward \|error" |
          tee -a "$out/documents.txt"
      done
    done
  done
  for docs in 16 64; do  # the forward alone: accumulate and finalize into outputs made once
    for causal in "" "--causal"; do
      $bin bench --backend cuda --impl flash_attn2 --batch 1 --heads 16 --head-dim 128 --seq 32768 --dtype bf16 \
        --warmup 2 --iters 10 --segments $docs $causal 2>&1 | grep -v "^#" | head -n 1 | tee -a "$out/documents_forward.txt"
    done
  done
  timeout 400 python3 bench/torch_documents.py 16x128x16 16x128x64 2>&1 | grep -v "Warning\|is_fx_tracing" | tee "$out/torch_documents.txt"
fi
if has python_gpus; then  # issue 22 on 2 GPUs, most wanted first (each step bounded; one log): torchrun with NCCL,
  # the training curve under torchrun and mpirun, the GPU ring's shards under mpirun, the C++ GPU ring tests over
  # both transports, the fault cases, then one GPU's Python CUDA tests
  log="$out/python_gpus.log"
  python_package
  $py -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.device_count(), 'GPUs')" | tee -a "$log"
  step() { echo "### $*" | tee -a "$log"; }
  step torchrun: test_torch_cuda_torchrun.py
  timeout 100 $py -m torch.distributed.run --standalone --nproc-per-node 2 -m pytest -q -rs -p no:cacheprovider \
    python/tests/test_torch_cuda_torchrun.py 2>&1 | grep -v "^W\|warnings.warn" | tee -a "$log" | tail -n 6
  step torchrun: train_ring.py on 2 GPUs
  timeout 120 $py -m torch.distributed.run --standalone --nproc-per-node 2 "${train_cuda[@]}" \
    --csv "$out/train_torchrun.csv" --png "$out/train_ring_cuda_torchrun.png" 2>&1 | grep -v "^W\|warnings.warn" | tee -a "$log" | tail -n 4
  step mpirun: test_torch_cuda_ring.py on 2 GPUs
  timeout 90 mpirun -np 2 -x PYTHONPATH $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda_ring.py \
    2>&1 | tee -a "$log" | tail -n 6
  step mpirun: train_ring.py on 2 GPUs
  timeout 100 mpirun -np 2 -x PYTHONPATH $py "${train_cuda[@]}" --csv "$out/train_mpirun.csv" 2>&1 | tee -a "$log" | tail -n 4
  for tr in nccl copy-engines; do
    for t in ring_backward_mpi_test ring_mpi_test; do
      step "$t on 2 GPUs over $tr"
      timeout 200 mpirun -np 2 $build/tests/$t --backend=cuda --transport=$tr --gtest_brief=1 2>&1 |
        grep -v "^\[  SKIPPED\|runs on the host\|^\s*$" | tee -a "$log" | tail -n 4
    done
  done
  step fault cases on 2 GPUs
  timeout 120 bash tests/launch/fault_test.sh $bin mpirun cuda 2>&1 | grep -E "^(ok|FAIL|skip)|passed|failed" | tee -a "$log" | tail -n 40
  step one GPU: test_torch_cuda.py test_jax_cuda.py
  timeout 150 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py python/tests/test_jax_cuda.py 2>&1 |
    tee -a "$log" | tail -n 12
fi
if has network; then  # issue 23: the ring over NCCL's socket path (loopback TCP) beside NVLink, forward and backward,
  # flash_attn2 steps, causal zigzag; the grad wire and NCCL's socket threads as what a slow link can be given
  log="$out/network.txt"
  row() { echo "# $1" | tee -a "$log"; shift; bench "$@" | tee -a "$log"; }
  for t in 8192 32768 65536; do  # the kernel's one-GPU rate at the ring's block sizes, for the model
    row "1 GPU" 1 --impl flash_attn2 --seq $t --iters 5 --causal --backward
  done
  sockets="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1"
  tuned="$sockets NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4"
  for link in nvlink sockets tuned; do
    case $link in nvlink) env=;; sockets) env=$sockets;; tuned) env=$tuned;; esac
    for t in 16384 65536 262144; do
      [ $t = 262144 ] && w=1 it=2 || { w=2; it=5; }
      ( [ -n "$env" ] && export $env; warmup=$w row "$link forward T=$t" 2 --impl ring --ring-transport nccl --seq $t --iters $it --causal --layout zigzag --step-times )
    done
    for t in 16384 65536 131072; do
      for wire in f32 bf16; do
        [ $link = nvlink ] && [ $wire = bf16 ] && [ $t != 65536 ] && continue
        [ $t = 131072 ] && w=1 it=2 || { w=1; it=4; }
        ( [ -n "$env" ] && export $env; warmup=$w row "$link backward T=$t wire $wire" 2 --impl ring --ring-transport nccl --seq $t --iters $it \
            --causal --layout zigzag --backward --grad-wire $wire )
      done
    done
  done
fi
if has padding_ab; then  # the flash kernels' exact head dims on the padded instances (runtime column bounds) where
  # this build chose so (mma.sync at 64 / 128, wgmma's forward at 128) against the variants (variants/ringattn_before_*,
  # e.g. a script running another pack's ringattn): GPU tests, then forward and backward, one GPU, and the ring of 2
  # ranks sharing it (the forward's carry instances)
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 8
  padding_rows() {
    local b=$1 causal shape kernel
    for causal in "" "--causal"; do
      for shape in "32 128" "64 64"; do
        for kernel in auto mma_sync; do
          echo -n "$kernel H=${shape% *} D=${shape#* } $causal: " | tee -a "$out/bench.txt"
          $b bench --backward --backend cuda --impl flash_attn2 --flash-kernel $kernel --batch 1 --heads ${shape% *} \
            --head-dim ${shape#* } --seq 32768 --dtype bf16 --warmup 2 --iters 10 $causal 2>&1 | grep -v '^#' |
            tr '\n' ' ' | tee -a "$out/bench.txt"; echo | tee -a "$out/bench.txt"
        done
      done
      echo -n "ring of 2 H=32 D=128 $causal: " | tee -a "$out/bench.txt"
      bin=$b bench 2 --impl ring --seq 32768 --iters 10 --layout zigzag $causal | tr '\n' ' '; echo | tee -a "$out/bench.txt"
    done
  }
  variants='ringattn_before_*' for_each_build padding_rows
fi
if has lse_gradient_tests; then  # gradients through lse: GPU tests, the ring backward's over both transports
  unit_tests
  for tr in copy-engines nccl; do
    timeout 250 mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --transport=$tr --gtest_brief=1 2>&1 |
      tee "$out/ring_backward_mpi_test_2gpu_$tr.log" | grep -v "^\[  SKIPPED\|runs on the host\|^\s*$" | tail -n 4
  done
fi
if has lse_gradient_python; then  # gradients through lse: the Python layer's CUDA tests, then what it costs
  python_package
  timeout 300 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py 2>&1 | tee "$out/python_cuda.log" |
    tail -n 6
  timeout 300 mpirun -np 2 -x PYTHONPATH $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda_ring.py \
    2>&1 | tee "$out/python_cuda_ring.log" | tail -n 6
  timeout 300 $py -m torch.distributed.run --standalone --nproc-per-node 2 -m pytest -q -rs -p no:cacheprovider \
    python/tests/test_torch_cuda_torchrun.py 2>&1 | tee "$out/python_cuda_torchrun.log" | tail -n 5
  timeout 200 $py bench/lse_gradient_cost.py --iters 10 2>&1 | tee "$out/lse_gradient_cost.txt"
fi
if has varlen; then  # packed batches in FlashAttention's varlen shapes; delta once a call in the GPU backward
  unit_tests
  for tr in copy-engines nccl; do
    timeout 250 mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --transport=$tr --gtest_brief=1 2>&1 |
      tee "$out/ring_backward_mpi_test_2gpu_$tr.log" | grep -v "^\[  SKIPPED\|runs on the host\|^\s*$" | tail -n 4
  done
fi
if has varlen || has varlen_python; then
  python_package
  timeout 300 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py python/tests/test_torch_varlen.py 2>&1 |
    tee "$out/python_cuda.log" | tail -n 6
  timeout 300 mpirun -np 2 -x PYTHONPATH $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda_ring.py \
    2>&1 | tee "$out/python_cuda_ring.log" | tail -n 6
fi
if has varlen_bench; then  # attention_varlen beside PyTorch's varlen SDPA (FlashAttention-2's kernel), two rounds
  python_package
  for round in 1 2; do
    timeout 200 $py bench/torch_documents.py 16x128x16 16x128x64 32x128x4 --runs varlen,ringattn_varlen,ringattn_varlen_cudnn 2>&1 |
      grep -v "Warning\|is_fx_tracing" | tee -a "$out/varlen_documents.txt"
  done
fi
if has small_calls; then  # a small call's cost: kept side streams, positions not re-sent, eager calls off the op's dispatch
  unit_tests
  timeout 200 mpirun -np 2 $build/tests/ring_mpi_test --backend=cuda --gtest_brief=1 2>&1 | tee "$out/ring_mpi_test.log" | tail -n 3
  timeout 200 mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --gtest_brief=1 2>&1 |
    tee "$out/ring_backward_mpi_test.log" | grep -v "^\[  SKIPPED\|runs on the host\|^\s*$" | tail -n 3
  python_package
  timeout 300 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py python/tests/test_torch_varlen.py \
    python/tests/test_torch.py 2>&1 | tee "$out/python_cuda.log" | tail -n 4
  timeout 300 mpirun -np 2 -x PYTHONPATH $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda_ring.py \
    2>&1 | tee "$out/python_cuda_ring.log" | tail -n 3
  for round in 1 2; do  # the switches (removed after this measurement) give back the old behaviour
    for variant in "RA_EXPERIMENT_FRESH_STREAMS=1 RA_EXPERIMENT_OP_PATH=1" "RA_EXPERIMENT_OP_PATH=1" "RA_NO_EXPERIMENT=1"; do
      echo "== round $round: $variant" | tee -a "$out/small_call_cost.txt"
      env $variant timeout 120 $py bench/small_call_cost.py --seqs 512,2048,8192 --calls 40 2>&1 | grep "^T=" |
        tee -a "$out/small_call_cost.txt"
    done
  done
  timeout 200 $py bench/torch_documents.py 16x128x16 16x128x64 32x128x4 --runs varlen,ringattn_varlen,ringattn_varlen_cudnn \
    2>&1 | grep -v "Warning\|is_fx_tracing" | tee -a "$out/varlen_documents.txt"
fi
if has softcap_documents; then  # a soft cap beside segment ids (Gemma 2's packed documents) on both flash kernels' soft-cap instances
  unit_tests
  $build/tests/cuda_attention_test --gtest_filter='DeterministicBackward*' 2>&1 | grep -E "^\[ +(OK|FAILED) " | tee "$out/deterministic.log"
  timeout 250 mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --gtest_brief=1 2>&1 |
    tee "$out/ring_backward_mpi_test.log" | grep -v "^\[  SKIPPED\|runs on the host\|^\s*$" | tail -n 3
  d=$(mktemp -d)  # the CLI on one GPU and on the ring of 2 (sharing it): run --backward, then verify
  $bin generate --output $d/in.h5 --batch 1 --seq 2000 --heads 8 --kv-heads 2 --head-dim 128 --dtype bf16 --with-grad \
    --segments 7 >/dev/null
  for n in 1 2; do
    mpirun -np $n $bin run --backend cuda --input $d/in.h5 --output $d/out$n.h5 --causal --softcap 30 --backward --quiet &&
      mpirun -np $n $bin verify --input $d/in.h5 --output $d/out$n.h5 --causal --softcap 30 | tail -n 4
    echo "softcap + segments on $n rank(s) exit $?"
  done
  python_package
  timeout 300 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py python/tests/test_torch_varlen.py 2>&1 |
    tee "$out/python_cuda.log" | tail -n 4
fi
if has softcap_bench; then  # a soft cap beside segment ids: rows beside segments alone and the cap alone, FlexAttention's
  for round in 1 2; do  # segments alone, a soft cap alone, both: T = 16384 and 32768, H = 32, D = 128
    for t in 16384 32768; do
      for causal in "" "--causal"; do
        for flags in "--segments 16" "--softcap 50" "--softcap 50 --segments 16"; do
          echo -n "round $round T=$t $flags $causal: " | tee -a "$out/bench.txt"
          bench 1 --backward --impl flash_attn2 --seq $t --iters 10 $flags $causal | tr '\n' ' '
          echo | tee -a "$out/bench.txt"
        done
      done
    done
    for flags in "" "--softcap 50" "--segments 16" "--softcap 50 --segments 16"; do  # mma.sync (every GPU since Ampere)
      echo -n "round $round mma_sync T=16384 $flags: " | tee -a "$out/bench.txt"
      bench 1 --backward --impl flash_attn2 --flash-kernel mma_sync --seq 16384 --iters 6 $flags | tr '\n' ' '
      echo | tee -a "$out/bench.txt"
    done
  done
  python_package
  for round in 1 2; do  # beside FlexAttention with the same score_mod and document mask
    timeout 250 $py bench/torch_documents.py 32x128x16 16x128x64 --softcap 50 --runs flex,ringattn_varlen 2>&1 |
      grep -v "Warning\|is_fx_tracing" | tee -a "$out/softcap_documents.txt"
  done
fi
if has python_tests; then  # issue 22: the Python package's tests only, one GPU (CUDA tensors, then the host ones)
  python_package
  timeout 300 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py python/tests/test_jax_cuda.py 2>&1 |
    tee "$out/python_cuda.log" | tail -n 6
  timeout 300 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_core.py python/tests/test_torch.py 2>&1 |
    tee "$out/python_host.log" | tail -n 6
fi
if has backward_spans; then  # issue 21: where the ring backward's time goes, 2 GPUs (one GPU's rows beside)
  for t in 16384 32768; do
    for causal in "--causal" ""; do
      bench 1 --backward --impl flash_attn2 --seq $t --iters 10 $causal
      bench 2 --backward --impl ring --local-impl flash_attn2 --seq $t --iters 10 $causal ${causal:+--layout zigzag}
      bench 2 --backward --impl ring --local-impl flash_attn2 --seq $t --iters 10 $causal ${causal:+--layout zigzag} --step-times
    done
  done
  for t in 8192 16384; do  # the ring's blocks alone on one GPU (the local kernel at the ring's block size)
    bench 1 --backward --impl flash_attn2 --seq $t --iters 10 --causal
  done
fi
single_and_ring_rows() {  # one GPU's backward and the ring of 2's at 16384 and 32768 tokens, causal and not
  local t causal
  for t in 16384 32768; do
    for causal in "--causal" ""; do
      bin=$1 bench 1 --backward --impl flash_attn2 --seq $t --iters 10 $causal
      bin=$1 bench 2 --backward --impl ring --local-impl flash_attn2 --seq $t --iters 10 $causal ${causal:+--layout zigzag}
    done
  done
}
if has tile_order_ab; then  # issue 21: the backward's key blocks longest walk first, dK / dV written over (this build against the variants)
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 12
  timeout 300 mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --gtest_brief=1 2>&1 |
    tee "$out/ring_backward_mpi_test.log" | tail -n 8
  tile_order_rows() {
    local shape
    single_and_ring_rows "$1"
    for shape in "64 64" "16 256"; do
      bin=$1 heads=${shape% *} head_dim=${shape#* } bench 1 --backward --impl flash_attn2 --seq 32768 --iters 6 --causal
    done
    bin=$1 bench 1 --backward --impl flash_attn2 --flash-kernel mma_sync --seq 32768 --iters 6 --causal
  }
  variants='ringattn_before_*' for_each_build tile_order_rows
  bench 2 --backward --impl ring --local-impl flash_attn2 --seq 16384 --iters 10 --causal --layout zigzag --step-times
  bench 2 --backward --impl ring --local-impl flash_attn2 --seq 32768 --iters 10 --causal --layout zigzag --step-times
fi
ring_backward_cli() {  # the CLI's ring on 2 ranks: generate, run --backward, verify (B = 1, causal zigzag and not)
  local d causal
  d=$(mktemp -d)
  $bin generate --output $d/g.h5 --batch 1 --seq 3001 --heads 8 --kv-heads 2 --head-dim 128 --dtype bf16 --with-grad >/dev/null
  for causal in "" "--causal --layout zigzag"; do
    mpirun -np 2 $bin run --backend cuda --input $d/g.h5 --output $d/o.h5 --backward --quiet --overwrite $causal &&
      $bin verify --input $d/g.h5 --output $d/o.h5 ${causal%% --layout*} | tee -a "$out/backward_cli.txt"; echo "ring cli --backward $causal exit $?"
  done
}
if has ring_streams_ab; then  # issue 21: the ring backward's steps on a second stream, dK / dV written over and converted
  # as the last hop lands: GPU tests (both transports), the CLI on 2 ranks, then this build against the variants
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 6
  for tr in copy-engines nccl; do
    timeout 200 mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --transport=$tr --gtest_brief=1 2>&1 |
      tee "$out/ring_backward_mpi_test_$tr.log" | grep -v "^\[  SKIPPED" | tail -n 4
  done
  ring_backward_cli
  [ -n "${faults_only:-}" ] && FAULT_ONLY=$faults_only bash tests/launch/fault_test.sh $bin mpirun cuda 2>&1 |
    tee "$out/fault_cuda.log" | grep -E "^(ok|FAIL|skip)|passed"
  variants='ringattn_before_*' for_each_build single_and_ring_rows
  echo "# spans of this build" | tee -a "$out/bench.txt"
  bench 2 --backward --impl ring --local-impl flash_attn2 --seq 16384 --iters 10 --causal --layout zigzag --step-times
  bench 2 --backward --impl ring --local-impl flash_attn2 --seq 32768 --iters 10 --step-times
  bench 2 --backward --impl ring --local-impl cudnn --seq 32768 --iters 10 --causal --layout zigzag
fi
if has ring_priority; then  # issue 21: the ring backward's other ranks' blocks at a higher priority, the own block whole
  # from step 0: GPU tests (both transports, the forward's too), the CLI, the backward's faults, then the rows
  $build/tests/cuda_attention_test --gtest_brief=1 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 4
  ring_tests_both_transports
  ring_backward_cli
  FAULT_ONLY=backward bash tests/launch/fault_test.sh $bin mpirun cuda 2>&1 | tee "$out/fault_cuda.log" | grep -E "^(ok|FAIL|skip)|passed"
  for_each_build single_and_ring_rows
  echo "# spans of this build" | tee -a "$out/bench.txt"
  bench 2 --backward --impl ring --local-impl flash_attn2 --seq 16384 --iters 10 --causal --layout zigzag --step-times
  bench 2 --backward --impl ring --local-impl cudnn --seq 32768 --iters 10 --causal --layout zigzag
  for causal in "" "--causal --layout zigzag"; do  # against context_parallel's cuDNN backward there (issue 21's table)
    warmup=1 bench 2 --backward --impl ring --local-impl cudnn --seq 131072 --iters 3 $causal
  done
fi
ring_backward_rows() {  # the ring of 2's backward with binary $1 at 16384 and 32768 tokens, causal zigzag and not
  # ($steps_impl: the steps' local kernel, flash_attn2 unless set)
  local t causal
  for t in 16384 32768; do
    for causal in "--causal" ""; do
      bin=$1 bench 2 --backward --impl ring --local-impl "${steps_impl:-flash_attn2}" --seq $t --iters 10 $causal ${causal:+--layout zigzag}
    done
  done
}
if has ring_backward_ab; then  # issue 21: the ring backward (flash_attn2 steps) of this build against the variants
  for_each_build ring_backward_rows
  for t in 16384 32768; do
    for causal in "--causal" ""; do bench 1 --backward --impl flash_attn2 --seq $t --iters 10 $causal; done
  done
  bench 2 --backward --impl ring --local-impl flash_attn2 --seq 16384 --iters 10 --causal --layout zigzag --step-times
  bench 2 --backward --impl ring --local-impl flash_attn2 --seq 32768 --iters 10 --step-times
  bench 2 --backward --impl ring --local-impl cudnn --seq 32768 --iters 10 --causal --layout zigzag
fi
if has head_dims_backward; then  # issue 20: the wgmma backward's instances of 96 and 192 columns: GPU tests, then the
  # backward at FlashAttention-2's head dims (H x D x Dv, T = 32768), this build against the variants (a variant script
  # may run another pack's ringattn), interleaved, then PyTorch's SDPA backward on the same shapes
  unit_tests
  shapes=${shapes:-"32x96x96 32x80x80 16x160x160 16x192x192 16x192x128 32x128x128"}
  head_dim_rows() { rows_by_shape "$1" "" "--causal"; }
  rounds=${rounds:-1} for_each_build head_dim_rows
  python3 bench/torch_backward.py $(for s in $shapes; do IFS=x read -r h d dv <<< "$s"; [ $d = $dv ] && echo ${h}x$d || echo $s; done) 2>&1 |
    tee "$out/torch_backward.txt"
fi
if has dq_apart_ab; then  # issue 20: dQ by a query-block kernel of its own at D = 192 / 256: GPU tests, then the
  # backward there, default and --deterministic, this build against the variants, interleaved, then PyTorch's SDPA
  # (no_tests=1: the rows only, after a call that tested this build)
  unit_tests
  shapes=${shapes:-"16x192 16x256"}
  apart_rows() { rows_by_shape "$1" "" "--causal" "--deterministic" "--deterministic --causal"; }
  for_each_build apart_rows
  python3 bench/torch_backward.py $shapes 2>&1 | tee "$out/torch_backward.txt"
fi
if has dq_adds_ab; then  # issue 20: dQ's atomics while dV and dK form, a quad's 64 bytes of one row per atomic: the
  # kernels sharing add_dq_rows beyond the default instances (mma.sync, the extras, documents) against the variants
  dq_add_rows() {
    local causal
    for causal in "" "--causal"; do
      echo -n "mma_sync H=32 D=128 $causal: " | tee -a "$out/bench.txt"
      bin=$1 bench 1 --backward --impl flash_attn2 --flash-kernel mma_sync --seq 16384 --iters 6 $causal | tr '\n' ' '
      echo | tee -a "$out/bench.txt"
      for shape in "64 64" "32 128" "16 256"; do
        echo -n "dropout 0.1 H=${shape% *} D=${shape#* } $causal: " | tee -a "$out/bench.txt"
        bin=$1 heads=${shape% *} head_dim=${shape#* } bench 1 --backward --impl flash_attn2 --seq 16384 --iters 6 \
          --dropout 0.1 $causal | tr '\n' ' '
        echo | tee -a "$out/bench.txt"
      done
      echo -n "16 documents H=16 D=128 $causal: " | tee -a "$out/bench.txt"
      bin=$1 heads=16 bench 1 --backward --impl flash_attn2 --seq 32768 --iters 6 --segments 16 $causal | tr '\n' ' '
      echo | tee -a "$out/bench.txt"
    done
  }
  for_each_build dq_add_rows
fi
if has ring_sizes; then  # issue 21: the GPU ring's forward and backward tests on rings of 3 and 4 GPUs (copy engines),
  # then the ring with cudnn steps on 2 GPUs at T = 131072 and context_parallel's cuDNN backward, interleaved, two rounds
  for n in 3 4; do
    for t in ring_mpi_test ring_backward_mpi_test; do
      timeout 240 mpirun -np $n $build/tests/$t --backend=cuda --transport=copy-engines --gtest_brief=1 2>&1 |
        tee "$out/${t}_${n}gpu.log" | grep -v "^\[  SKIPPED\|runs on the host\|^\s*$" | tail -n 4
    done
  done
  for round in 1 2; do
    for causal in "" "--causal --layout zigzag"; do
      warmup=1 bench 2 --backward --impl ring --local-impl cudnn --seq 131072 --iters 3 $causal
    done
    CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 bench/torch_context_parallel.py --seqs 131072 --backends cudnn \
      --iters 3 2>&1 | tee -a "$out/context_parallel.txt" | grep -v "^W\|^\*\|OMP_NUM"
  done
fi
if has cudnn_streams_ab; then  # issue 21: the ring backward's cudnn steps on a second stream beside the own block:
  # the cudnn tests (one GPU, then the ring over both transports), the ring of this build against the variants (e.g.
  # variants/ringattn_cudnn_one_stream), interleaved, one GPU's cudnn backward, then context_parallel's at T = 131072
  $build/tests/cuda_attention_test --gtest_brief=1 --gtest_filter='*cudnn*' 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 3
  for tr in copy-engines nccl; do
    timeout 200 mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --transport=$tr --gtest_brief=1 \
      --gtest_filter='*cudnn*' 2>&1 | tee "$out/ring_backward_mpi_test_$tr.log" | grep -v "^\[  SKIPPED\|^\s*$" | tail -n 3
  done
  cudnn_ring_rows() {
    steps_impl=cudnn ring_backward_rows "$1"
    bin=$1 warmup=1 bench 2 --backward --impl ring --local-impl cudnn --seq 131072 --iters 3
  }
  for_each_build cudnn_ring_rows
  for t in 16384 32768; do
    for causal in "--causal" ""; do bench 1 --backward --impl cudnn --seq $t --iters 10 $causal; done
  done
  torchrun --nproc-per-node 2 bench/torch_context_parallel.py --seqs 131072 --backends cudnn --iters 3 2>&1 |
    tee -a "$out/context_parallel.txt" | grep "^context"
fi
if has tma_ab; then  # issues 20 / 21: the wgmma kernels' Q / dO (backward) and K / V (forward) tiles by TMA: GPU tests, then
  # `bench --backward` (forward, backward rows) at H x D, T = 32768, this build against the variants, interleaved,
  # then PyTorch's SDPA backward and forward on the same shapes (no_tests=1: no tests; no_torch_forward=1: its backward only)
  unit_tests
  shapes=${shapes:-"32x128 64x64 16x256 16x192 32x96"}
  tma_rows() { rows_by_shape "$1" "" "--causal"; }
  for_each_build tma_rows
  python3 bench/torch_backward.py $shapes 2>&1 | tee "$out/torch_backward.txt"
  [ -n "${no_torch_forward:-}" ] || python3 bench/torch_backward.py --forward $shapes 2>&1 | tee "$out/torch_forward.txt"
fi
if has share_rows; then  # issue 21: one GPU's backward and the ring of 2's at 8192 and 16384 tokens per GPU, no tests
  variants=none for_each_build single_and_ring_rows
  echo "# spans of this build" | tee -a "$out/bench.txt"
  bench 2 --backward --impl ring --local-impl flash_attn2 --seq 16384 --iters 10 --causal --layout zigzag --step-times
fi
if has carry_tma_ab; then  # issue 21: the forward's carry instances (the ring's steps) load K / V by TMA: GPU tests (the
  # ring over both transports on 2 GPUs), then the ring of 2's forward and backward rows, this build against the
  # variants, interleaved, then one GPU's rows at the same global T (no_tests=1: no tests)
  unit_tests
  [ -n "${no_tests:-}" ] || ring_tests_both_transports
  carry_rows() {
    local t causal
    for t in ${ring_seqs:-16384 32768 131072}; do
      for causal in "" "--causal --layout zigzag"; do
        bin=$1 bench 2 --backward --impl ring --local-impl flash_attn2 --seq $t --iters 6 $causal
      done
    done
  }
  for_each_build carry_rows
  for t in ${ring_seqs:-16384 32768 131072}; do
    for causal in "" "--causal"; do bench 1 --backward --impl flash_attn2 --seq $t --iters 6 $causal; done
  done
fi
if has readme_tables; then  # the README's performance tables in one call on 2 GPUs; bench/readme_tables.py reads
  # $out/readme_tables.txt (each of our rows after its label) and PyTorch's lines beside it into those tables
  tables_rows() {  # label (one_gpu or ring : local kernel : HxD), then bench's arguments
    local label=$1; shift
    bench "$@" | sed "s/^/$label /" >> "$out/readme_tables.txt"
  }
  for t in 16384 32768; do
    for causal in "" "--causal"; do
      for local in cudnn flash_attn2; do
        tables_rows "one_gpu:$local:32x128" 1 --backward --impl $local --seq $t --iters 10 $causal
        tables_rows "ring:$local:32x128" 2 --backward --impl ring --local-impl $local --seq $t --iters 10 $causal ${causal:+--layout zigzag}
      done
    done
  done
  timeout 240 python3 -m torch.distributed.run --nproc-per-node 2 bench/torch_context_parallel.py --seqs 16384 32768 2>&1 |
    grep "^context_parallel_" | tee -a "$out/readme_tables.txt"
  shapes="32x128 64x64 16x192 16x256"
  for shape in ${shapes#32x128 }; do  # T = 32768 at H = 32, D = 128 ran above
    IFS=x read -r h d <<< "$shape"
    for causal in "" "--causal"; do
      for impl in cudnn flash_attn2; do
        heads=$h head_dim=$d tables_rows "one_gpu:$impl:$shape" 1 --backward --impl $impl --seq 32768 --iters 10 $causal
      done
    done
  done
  for pass in "" "--forward"; do python3 bench/torch_backward.py $pass $shapes 2>&1 | grep "^torch_" | tee -a "$out/readme_tables.txt"; done
  python3 bench/readme_tables.py "$out/readme_tables.txt" | tee "$out/readme_tables.md"
fi
if has cudnn_ring_ab; then  # issue 21: the ring's cudnn steps with the own block half beside the steps and half after
  # them (over the last hop), and their dK / dV partials written over, unzeroed: the cudnn GPU tests, the ring's over both
  # transports, the ring of this build against the variants (variants/ringattn_cudnn_*) interleaved, one GPU's cudnn
  # rows, then this build's spans
  $build/tests/cuda_attention_test --gtest_brief=1 --gtest_filter='CudnnBackward.*:*udnn*:-*Chunked*' 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 3
  for tr in copy-engines nccl; do
    timeout 200 mpirun -np 2 $build/tests/ring_backward_mpi_test --backend=cuda --transport=$tr --gtest_brief=1 \
      --gtest_filter='*udnn*' 2>&1 | tee "$out/ring_backward_mpi_test_$tr.log" | grep -v "^\[  SKIPPED\|^\s*$" | tail -n 3
  done
  steps_impl=cudnn for_each_build ring_backward_rows
  for t in 16384 32768; do
    for causal in "--causal" ""; do bench 1 --backward --impl cudnn --seq $t --iters 10 $causal; done
  done
  for causal in "--causal --layout zigzag" ""; do
    mpirun -np 2 $bin bench --backward --backend cuda --impl ring --local-impl cudnn --batch 1 --heads 32 --head-dim 128 \
      --dtype bf16 --warmup 2 --iters 6 --seq 16384 --step-times $causal 2>&1 | tee -a "$out/spans.txt" | grep -v "^#"
  done
fi
if has million; then  # issue 21: forward + backward of 1M tokens causal on 2 GPUs, each local kernel
  million_tokens cudnn flash_attn2
fi
if has staged_extras; then  # issue 20: a mask alone staged in shared memory (the wgmma kernels' mask instances): the
  # GPU tests with a mask, bench rows without a mask, with it and with a bias (the bias instances), the rings' mask cases
  # (2 ranks, sharing the GPUs there are), then PyTorch's FlexAttention and SDPA with the same kind of mask
  timeout 150 $build/tests/cuda_attention_test --gtest_brief=1 --gtest_filter='*mask*' 2>&1 | tee "$out/cuda_attention_test.log" | tail -n 8
  for shape in "32 128" "64 64"; do
    set -- $shape
    for causal in "" "--causal"; do
      for option in "" "--mask" "--bias"; do
        heads=$1 head_dim=$2 bench 1 --backward --impl flash_attn2 --seq 16384 --iters 10 $option $causal
      done
    done
  done
  for t in ring_mpi_test ring_backward_mpi_test; do
    timeout 100 mpirun -np 2 $build/tests/$t --backend=cuda --gtest_brief=1 --gtest_filter='*mask*' 2>&1 |
      tee "$out/$t.log" | grep -v "^\[  SKIPPED\|^\s*$" | tail -n 4
  done
  for causal in 0 1; do
    timeout 100 python3 bench/torch_extras.py --only mask --seq 16384 --causal $causal 2>&1 | tee -a "$out/torch_extras.txt"
  done
fi
if has mask_tiles; then  # issue 20: the mask instances leave out the tiles a mask hides whole (MaskTiles): tests, then
  # documents given as a boolean mask against the same documents as segment ids and FlexAttention's document block mask
  # (bench/torch_documents.py's shapes, T = 32768), and a dense random mask (every tile computed, as before) at T = 16384
  # beside no mask, H = 32 D = 128 and H = 64 D = 64
  mask_tests '*mask*:*MaskTiles*:*bias*' '*mask*'
  documents_rows "" "--mask-documents"
  for causal in "" "--causal"; do
    heads=32 head_dim=128 bench 1 --backward --impl flash_attn2 --seq 16384 --iters 10 --mask $causal
  done
  heads=32 head_dim=128 bench 1 --backward --impl flash_attn2 --seq 16384 --iters 10
  heads=64 head_dim=64 bench 1 --backward --impl flash_attn2 --seq 16384 --iters 10 --mask
  timeout 240 python3 bench/torch_documents.py --runs flex 16x128x16 16x128x64 2>&1 | tee "$out/torch_documents.txt"
fi
if has mend_tests; then  # fifty-fifth session: the mask summary's index helpers (a review mend of the CUDA code) and outputs
  # that share memory with inputs refused: the SASS check, the GPU tests whole
  python3 bench/check_wgmma_convergence.py $(ls $build/lib/libra_core.so $build/attention/libra_attention.a 2>/dev/null | head -n 1) |
    tee "$out/wgmma_convergence.txt" | tail -n 3
  tests_timeout=380 mask_tests '*' ''
fi
if has mend_python; then  # the same session: the rings' tests whole (2 ranks sharing the GPU), the Python package's CUDA
  # tests, then the named mask's documents rows beside segment ids (the summary's helpers are in both passes' code)
  ring_timeout=130 mask_tests '' '*'
  if [ -d $build/python/ringattn ]; then
    PYTHONPATH=$build/python timeout 300 python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py 2>&1 |
      tail -n 6 | tee "$out/python_tests.log"
  fi
  documents_rows "" "--mask-documents --mask-named"
fi
if has mask_named; then  # issue 20: a named mask's tile summary made once and kept (MaskTiles): the GPU tests with a mask, the
  # rings' mask cases, then documents as a mask summarised every call and named (made once), beside segment ids and
  # FlexAttention's document block mask (made once, outside its timing), and a dense random mask either way
  mask_tests '*mask*:*Mask*:*bias*:*segment*' '*mask*:*Mask*:*segment*'
  if [ -d $build/python/ringattn ]; then  # the Python layer names its masks itself: its CUDA tests with a mask
    PYTHONPATH=$build/python timeout 200 python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py \
      -k "mask or option or graph" 2>&1 | tail -n 6 | tee "$out/python_tests.log"
  fi
  documents_rows "" "--mask-documents" "--mask-documents --mask-named"
  for how in "" "--mask-named"; do
    echo "# dense random mask ${how:-summarised every call}" | tee -a "$out/bench.txt"
    heads=32 head_dim=128 bench 1 --backward --impl flash_attn2 --seq 16384 --iters 10 --mask $how
  done
  timeout 240 python3 bench/torch_documents.py --runs flex 16x128x16 16x128x64 2>&1 | tee "$out/torch_documents.txt"
  if [ -d $build/python/ringattn ]; then  # 8 layers sharing one mask through ringattn.torch
    for docs in 16 64; do
      PYTHONPATH=$build/python timeout 100 python3 bench/torch_named_mask.py --documents $docs 2>&1 | tee -a "$out/torch_named_mask.txt"
    done
  fi
fi
