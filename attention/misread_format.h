#pragma once
// Which other tensor format a q / k pair read as bshd (batch, len, heads, dim) most likely holds: the one
// rule behind the CLI's note on a file's datasets and the Python functions' warning on arrays.
#include <cstdint>

namespace ra {

enum class MisreadFormat { kNone, kBHSD, kSBHD };

// More query heads than any model has (128 the most seen), and more than the tokens: (batch, heads, len, dim).
inline constexpr int64_t kMostQueryHeads = 256;

// (batch, q_len, q_heads) of q and k's len, as bshd reads them.
inline MisreadFormat likely_misread_format(int64_t batch, int64_t q_len, int64_t q_heads, int64_t kv_len) {
  if (q_heads > kMostQueryHeads && q_heads > q_len) return MisreadFormat::kBHSD;
  // Batch rows of one query and one key each (their output is v): (len, batch, heads, dim).
  if (batch > 1 && q_len == 1 && kv_len == 1) return MisreadFormat::kSBHD;
  return MisreadFormat::kNone;
}

}  // namespace ra
