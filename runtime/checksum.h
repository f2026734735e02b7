// CRC-32 (zlib's) of a byte range of any length: the ranks compare their command lines by it (launch/job.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ra {

uint32_t crc32_bytes(const void* data, size_t bytes);

}  // namespace ra
