#!/bin/bash
# Packs a device build (e.g. build-dev, configured with -DCMAKE_CUDA_ARCHITECTURES=90a-real: machine code only, as
# 90a's PTX adds about 10 MB of compressed fatbin that no other device can use; and, for the Python tests,
# -DPython_EXECUTABLE=<a python3.12> as the device image's) into a folder that fits a device call's
# 64 MiB carry: each statically linked program holds every kernel's fatbin (about 47 MB, which does not
# compress), so the four layer libraries are linked once into lib/libra_core.so and the CLI, the GPU test
# programs and the Python module are relinked against it from the build's own objects (their rpath finds it).
#   bash bench/pack_for_device.sh BUILD PACK      then carry ".device" and PACK; gpu_session.sh takes PACK as BUILD
set -euo pipefail
build=$(cd "${1:?build folder}" && pwd); pack=$(mkdir -p "${2:?pack folder}" && cd "$2" && pwd)
cd "$build"
layers="attention/libra_attention.a mesh/libra_mesh.a collectives/libra_collectives.a runtime/libra_runtime.a"
link_of() {  # the link command ninja runs for target $1, without its post-build steps
  ninja -t commands "$1" | tail -n 1 | sed -e 's/^: && //' -e 's/ && :$//' -e 's/ && cd .*//'
}
mkdir -p "$pack/lib" "$pack/bin" "$pack/tests" "$pack/python/ringattn"
# The libraries the layers need, as the CLI's link names them after the last layer.
deps=$(link_of bin/ringattn | sed -e 's/.*runtime\/libra_runtime.a//')
g++ -shared -o "$pack/lib/libra_core.so" -Wl,-soname,libra_core.so -Wl,--whole-archive $layers /usr/local/cuda/lib/libcudart_static.a \
  -Wl,--no-whole-archive $deps
relink() {  # target, its place in the pack, rpath to lib/ from there
  local cmd
  cmd=$(link_of "$1" | sed -e "s# attention/libra_attention.a  mesh/libra_mesh.a  collectives/libra_collectives.a # #" \
    -e "s# runtime/libra_runtime.a # $pack/lib/libra_core.so -Wl,-rpath,'$3' #" -e "s# -o $1 # -o $pack/$2 #")
  (eval "$cmd")
}
relink bin/ringattn bin/ringattn '$ORIGIN/../lib'
for t in cuda_attention_test ring_mpi_test ring_backward_mpi_test; do relink tests/$t tests/$t '$ORIGIN/../lib'; done
core=$(cd python/ringattn && ls _core.*.so 2>/dev/null || true)
if [ -n "$core" ]; then
  relink python/ringattn/$core python/ringattn/$core '$ORIGIN/../../lib'
  cp python/ringattn/*.py "$pack/python/ringattn/"
  cp python/ringattn/*.pyi "$pack/python/ringattn/" 2>/dev/null || true  # stubs: made by the whole build only
fi
strip "$pack"/lib/*.so "$pack"/bin/* "$pack"/tests/*
du -sh "$pack"
