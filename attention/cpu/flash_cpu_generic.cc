// The CPU flash kernel for generic (compile flags set in CMakeLists.txt).
#define RA_ISA_NAMESPACE isa_generic
#define RA_VEC_BYTES 16
#define RA_TILE_ROWS 4
#define RA_TILE_VECS 2
#include "attention/cpu/flash_cpu_kernel.inc"
#include "attention/cpu/flash_cpu_backward.inc"
