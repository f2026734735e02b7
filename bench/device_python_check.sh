#!/bin/bash
# The Python package on one GPU machine, in one call: the CUDA tests (one GPU, and the GPU ring of 2 ranks
# sharing it where there is one), ringattn.hf's tests with the image's PyTorch, then bench/hf_train_step.py.
# Needs, beside the pack (bench/pack_for_device.sh, its module built for the image's Python 3.12):
# .device/wheels (mpi4py built against Debian's Open MPI, pytest's wheels; bench/gpu_session.sh says how) and
# .device/hfpylib.tar.xz (transformers 5.24.0 and what it imports, installed for Python 3.12 with
# `pip install --no-deps --target hfpylib`, its models/ cut to auto, llama, gemma2, gpt_oss, modernbert).
#   [RA_BENCH_ONLY=1] bash .device/on-device.sh bash bench/device_python_check.sh PACK [T...]
set -uo pipefail
pack=${1:?pack folder}; shift
seqs=("${@:-16384 32768}")
py=${RA_DEVICE_PYTHON:-python3}
out=${OUT:-/tmp/out}
mkdir -p "$out"
$py -m pip install -q --no-deps --target /tmp/pylib .device/wheels/*.whl 2>&1 | tail -n 2
tar -xJf .device/hfpylib.tar.xz -C /tmp
export PYTHONPATH=$pack/python:/tmp/pylib:/tmp/hfpylib OMP_NUM_THREADS=4
$py -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, torch.cuda.get_device_name())" | tee "$out/python_check.log"
step() { echo "### $*" | tee -a "$out/python_check.log"; }
if [ -z "${RA_BENCH_ONLY:-}" ]; then  # RA_BENCH_ONLY=1: hf_train_step.py alone
step test_torch_cuda.py
timeout 240 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch_cuda.py 2>&1 | tail -n 4 |
  tee -a "$out/python_check.log"
step test_torch_cuda_ring.py, 2 ranks
timeout 150 mpirun -np 2 -x PYTHONPATH -x OMP_NUM_THREADS $py -m pytest -q -rs -p no:cacheprovider \
  python/tests/test_torch_cuda_ring.py 2>&1 | tail -n 3 | tee -a "$out/python_check.log"
step test_torch.py test_hf.py
timeout 120 $py -m pytest -q -rs -p no:cacheprovider python/tests/test_torch.py python/tests/test_hf.py 2>&1 |
  tail -n 3 | tee -a "$out/python_check.log"
fi
for T in ${seqs[*]}; do
  step hf_train_step.py --seq "$T"
  timeout 150 $py bench/hf_train_step.py --seq "$T" --iters 10 2>&1 | grep -v Warning | tee -a "$out/hf_train_step.txt"
done
