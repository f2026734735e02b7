// The block checksum on the host. sum (2 (f + i) + 1) x_i = 2 f S + 2 sum i x_i + S, where S = sum x_i;
// with Fletcher's running sums (a += x_i, b += a after each word, so b = sum (n - i) x_i), sum i x_i =
// n S - b: two additions per word, which the compiler vectorises, all exact mod 2^64.
#include "attention/ring/block_seal.h"

#include <cstring>

namespace ra {

uint64_t block_checksum(const void* data, size_t bytes, uint64_t first_word) {
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t words = bytes / 4;
  uint64_t a = 0, b = 0;
  for (size_t i = 0; i < words; ++i) {
    uint32_t x;
    std::memcpy(&x, p + 4 * i, 4);
    a += x;
    b += a;
  }
  uint64_t n = words;
  if (bytes % 4 != 0) {
    uint32_t x = 0;
    std::memcpy(&x, p + 4 * words, bytes % 4);  // little-endian: the tail's bytes are the word's low bytes
    a += x;
    b += a;
    ++n;
  }
  const uint64_t weighted = n * a - b;  // sum i x_i
  return 2 * first_word * a + 2 * weighted + a;
}

}  // namespace ra
