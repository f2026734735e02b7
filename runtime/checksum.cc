#include "runtime/checksum.h"

#include <zlib.h>

#include <algorithm>

namespace ra {

uint32_t crc32_bytes(const void* data, size_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {  // zlib takes 32-bit lengths
    const uInt chunk = uInt(std::min<size_t>(bytes, size_t(1) << 30));
    crc = crc32(crc, p, chunk);
    p += chunk;
    bytes -= chunk;
  }
  return uint32_t(crc);
}

}  // namespace ra
