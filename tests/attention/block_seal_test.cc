// The seal of blocks in flight (attention/ring/block_seal.h) on the host: the checksum against its
// definition word by word, and the host ring's seal / check of a block (the GPU ring's device checksum
// is compared with the same host function in cuda_kernels_test.cc: one format on both rings).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "attention/ring/block_seal.h"
#include "attention/ring/host_block.h"
#include "runtime/error.h"

namespace ra {
namespace {

// The definition: the sum of (2 (first_word + i) + 1) x_i over the little-endian 32-bit words, the
// last one zero-extended, mod 2^64.
uint64_t checksum_by_definition(const std::vector<uint8_t>& bytes, uint64_t first_word) {
  uint64_t sum = 0;
  for (size_t i = 0; 4 * i < bytes.size(); ++i) {
    uint64_t x = 0;
    for (size_t b = 0; b < 4 && 4 * i + b < bytes.size(); ++b) x |= uint64_t(bytes[4 * i + b]) << (8 * b);
    sum += (2 * (first_word + i) + 1) * x;
  }
  return sum;
}

TEST(BlockSeal, ChecksumFollowsTheDefinitionForAnyLengthAndOffset) {
  std::mt19937_64 rng(5);
  for (size_t length : {0, 1, 2, 3, 4, 5, 7, 64, 1001, 65536 + 3}) {
    std::vector<uint8_t> bytes(length);
    for (uint8_t& b : bytes) b = uint8_t(rng());
    for (uint64_t first_word : {uint64_t(0), uint64_t(1), uint64_t(1) << 31, uint64_t(3) << 40})
      EXPECT_EQ(block_checksum(bytes.data(), length, first_word), checksum_by_definition(bytes, first_word))
          << length << " bytes from word " << first_word;
  }
}

TEST(BlockSeal, AFlippedBitOrSwappedWordsChangeTheChecksum) {
  std::vector<uint8_t> bytes(4096);
  std::mt19937_64 rng(9);
  for (uint8_t& b : bytes) b = uint8_t(rng());
  const uint64_t base = block_checksum(bytes.data(), bytes.size());
  for (size_t bit : {0, 7, 1000, 32767}) {
    std::vector<uint8_t> flipped = bytes;
    flipped[bit / 8] ^= uint8_t(1u << (bit % 8));
    EXPECT_NE(block_checksum(flipped.data(), flipped.size()), base) << "bit " << bit;
  }
  std::vector<uint8_t> swapped = bytes;
  std::swap_ranges(swapped.begin() + 8, swapped.begin() + 12, swapped.begin() + 400);
  EXPECT_NE(block_checksum(swapped.data(), swapped.size()), base);
}

TEST(BlockSeal, HostRingChecksWhatArrived) {
  const size_t payload = 203;  // not a whole number of words: the host ring packs its sections tight
  BlockBuffers buffers(payload, 1);
  char* block = buffers[0];
  for (size_t i = 0; i < payload; ++i) block[i] = char(i * 7);
  seal_block(block, 2, payload, true);
  BlockSeal seal;
  std::memcpy(&seal, block + payload, sizeof(seal));
  EXPECT_EQ(seal.magic, BlockSeal::kMagic);
  EXPECT_EQ(seal.origin_rank, 2u);
  EXPECT_EQ(seal.checksum, block_checksum(block, payload));
  EXPECT_NO_THROW(check_arrived_block(block, payload, true, 0, 1, 3, 2, "K/V block"));
  auto message = [&](int expected_origin) {
    try {
      check_arrived_block(block, payload, true, 0, 1, 3, expected_origin, "K/V block");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(1).find("malformed K/V block from rank 1"), std::string::npos) << message(1);
  block[100] ^= 0x40;
  EXPECT_NE(message(2).find("corrupted in flight"), std::string::npos) << message(2);
  EXPECT_NO_THROW(check_arrived_block(block, payload, false, 0, 1, 3, 2, "K/V block"));  // checksums off
}

}  // namespace
}  // namespace ra
