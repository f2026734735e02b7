// CRC-32 (zlib's) of a byte range of any length: the integrity check of blocks in flight.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ra {

uint32_t crc32_bytes(const void* data, size_t bytes);

}  // namespace ra
