// The CPU flash kernel for avx2 (compile flags set in CMakeLists.txt).
#define RA_ISA_NAMESPACE isa_avx2
#define RA_VEC_BYTES 32
#define RA_TILE_ROWS 4
#define RA_TILE_VECS 2
#include "attention/cpu/flash_cpu_kernel.inc"
#include "attention/cpu/flash_cpu_backward.inc"
