// The CPU flash kernel for avx512 (compile flags set in CMakeLists.txt).
#define RA_ISA_NAMESPACE isa_avx512
#define RA_VEC_BYTES 64
#define RA_TILE_ROWS 4
#define RA_TILE_VECS 4
#include "attention/cpu/flash_cpu_kernel.inc"
#include "attention/cpu/flash_cpu_backward.inc"
