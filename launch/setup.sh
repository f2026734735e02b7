#!/usr/bin/env bash
# ringattn set-up on a fresh Debian 12 machine (root): installs missing packages, builds into build/,
# then either runs the main job (demo) or the whole test suite (test).
#   launch/setup.sh demo   generate -> mpirun -np 4 ring attention -> verify against the f64 reference
#   launch/setup.sh test   every CTest test (unit, MPI at 1-4 ranks, CLI); GPU tests skip without a GPU
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-test}
# clang with its fuzzer and sanitizer runtimes (libclang-rt-14-dev) builds the fuzz targets.
packages="g++ cmake ninja-build ccache openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools
  libboost-program-options-dev libgtest-dev libbenchmark-dev libopenblas-dev nlohmann-json3-dev
  pkg-config python3-h5py zlib1g-dev unzip clang libclang-rt-14-dev
  python3-dev python3-numpy python3-pytest python3-mpi4py python3-pip python3-venv"
# pip fetches nanobind (the Python module's bindings) and, with CUDA, cudnn-frontend (below).
missing=$(for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "installing: $missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
jobs=$(nproc)
# cudnn-frontend (header-only, MIT) for the `cudnn` implementation, when CUDA is here: from its
# PyPI wheel, pinned by version and hash. A CUDA build that cannot get it stops here, loudly;
# RA_WITHOUT_CUDNN=1 builds without `cudnn` on purpose.
frontend=build/_deps/cudnn_frontend
if command -v nvcc >/dev/null && [ -z "${RA_WITHOUT_CUDNN:-}" ] && [ ! -f $frontend/include/cudnn_frontend.h ]; then
  mkdir -p $frontend/wheel
  echo "nvidia-cudnn-frontend==1.32.0 --hash=sha256:c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0" \
    > $frontend/requirements.txt
  if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
       --platform manylinux_2_28_x86_64 -r $frontend/requirements.txt -d $frontend/wheel; then
    echo "error: could not fetch cudnn-frontend 1.32.0 (pinned by hash) from PyPI for the cudnn implementation;" >&2
    echo "       RA_WITHOUT_CUDNN=1 builds without it, RA_CMAKE_ARGS=-DRA_ENABLE_CUDA=OFF without CUDA" >&2
    exit 1
  fi
  unzip -q -o $frontend/wheel/*.whl 'include/*' -d $frontend
fi
# nanobind (BSD-3) for the Python module ringattn._core: its wheel from PyPI, pinned by version and hash.
nanobind=build/_deps/nanobind
if [ ! -f $nanobind/nanobind/cmake/nanobind-config.cmake ]; then
  mkdir -p $nanobind/wheel
  echo "nanobind==2.9.2 --hash=sha256:c37957ffd5eac7eda349cff3622ecd32e5ee1244ecc912c99b5bc8188bafd16e" \
    > $nanobind/requirements.txt
  if ! /usr/bin/python3 -m pip download -q --no-deps --only-binary=:all: -r $nanobind/requirements.txt -d $nanobind/wheel; then
    echo "error: could not fetch nanobind 2.9.2 (pinned by hash) from PyPI for the Python module" >&2
    exit 1
  fi
  unzip -q -o $nanobind/wheel/*.whl 'nanobind/*' -d $nanobind
fi
# PyTorch for the PyTorch layer's tests (ringattn.torch): PyPI's wheel, pinned, in a virtual environment
# that also sees Debian's Python packages. About 3 GB with the CUDA libraries PyPI's wheel brings;
# RA_WITHOUT_TORCH=1 skips it (those tests then skip, saying why).
torch_venv=build/_deps/torch-venv
if [ -z "${RA_WITHOUT_TORCH:-}" ] && ! $torch_venv/bin/python -c 'import torch' 2>/dev/null; then
  echo "installing PyTorch 2.15.0 from PyPI into $torch_venv (about 3 GB; RA_WITHOUT_TORCH=1 skips it)"
  /usr/bin/python3 -m venv --system-site-packages $torch_venv
  if ! $torch_venv/bin/python -m pip install -q torch==2.15.0; then
    echo "error: could not install torch 2.15.0 from PyPI for the PyTorch layer's tests; RA_WITHOUT_TORCH=1 skips them" >&2
    exit 1
  fi
fi
# Hugging Face Transformers, pinned, beside it for ringattn.hf's tests (tiny random models: nothing downloaded).
if [ -z "${RA_WITHOUT_TORCH:-}" ] && ! $torch_venv/bin/python -c 'import transformers' 2>/dev/null; then
  echo "installing transformers 5.24.0 from PyPI into $torch_venv (about 60 MB)"
  if ! $torch_venv/bin/python -m pip install -q transformers==5.24.0; then
    echo "error: could not install transformers 5.24.0 from PyPI for ringattn.hf's tests; RA_WITHOUT_TORCH=1 skips them" >&2
    exit 1
  fi
fi
# Where no GPU is visible (nvidia-smi lists none), no test runs a CUDA kernel: the test command compiles the
# CUDA code only to check that it builds (every kernel instance, unoptimised: minutes instead of most of an hour
# on 2 cores), and a GPU refuses to run that build. demo, and test on a machine with a GPU, build it optimised.
cuda_check=()
if command -v nvcc >/dev/null; then
  if [ "$mode" = test ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "no GPU here: the CUDA code is compiled as a check only (unoptimised; GPUs refuse this build, demo builds it optimised)"
    cuda_check=(-DRA_CUDA_COMPILE_CHECK=ON)
  else
    cuda_check=(-DRA_CUDA_COMPILE_CHECK=OFF)
  fi
fi
# Debian's Python, where the packages above put numpy, pytest and mpi4py.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=/usr/bin/python3 "${cuda_check[@]}" \
  ${RA_CMAKE_ARGS:-}
cmake --build build -j "$jobs"
case "$mode" in
  demo)
    mkdir -p build/demo
    build/bin/ringattn generate --output build/demo/sample.h5 --batch 1 --seq 2048 --heads 8 --kv-heads 2 \
      --head-dim 64 --dtype bf16 --with-mask --overwrite
    mpirun --oversubscribe -np 4 -x OMP_NUM_THREADS=1 build/bin/ringattn run --input build/demo/sample.h5 \
      --output build/demo/out.h5 --causal --overwrite
    mpirun --oversubscribe -np 4 -x OMP_NUM_THREADS=1 build/bin/ringattn verify --input build/demo/sample.h5 \
      --output build/demo/out.h5 --causal
    ;;
  test)
    OMP_NUM_THREADS=1 ctest --test-dir build -j "$jobs" --output-on-failure --timeout 600
    ;;
  *) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac
