// Bad input throws before any work, with a message naming the tensor, the dimension and what was
// expected.
#include <gtest/gtest.h>

#include "attention/registry.h"
#include "runtime/error.h"
#include "tests/support/problem.h"

namespace ra::test {
namespace {

// Runs flash_attn2 on the inputs and returns the error message ("" if nothing was thrown).
std::string error_of(const AttentionInputs& in, const AttentionParams& params) {
  try {
    AttentionRegistry::builtin().create("flash_attn2", Backend::kCpu)->forward(in, params);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

class BadInput : public testing::Test {
 protected:
  Problem p{ProblemSpec{2, 16, 24, 4, 2, 32, 32}};
};

// A forced CUDA flash kernel is a choice only flash_attn2 on cuda (and the GPU ring over it) makes: any
// other implementation refuses it by name, forward and backward, instead of ignoring it.
TEST_F(BadInput, ForcedFlashKernelElsewhere) {
  AttentionParams params = p.params();
  params.flash_kernel = FlashKernel::kMmaSync;
  EXPECT_EQ(error_of(p.inputs(), params), "flash_kernel mma_sync chooses the kernels of flash_attn2 on cuda (and of the "
            "GPU ring over it), but implementation 'flash_attn2' on cpu runs none of them");
  auto sdpa = AttentionRegistry::builtin().create("sdpa", Backend::kCpu);
  const Tensor d_o(DType::kF32, {2, 16, 4, 32});
  EXPECT_THROW(sdpa->backward(p.inputs(), params, d_o), Error);
  params.flash_kernel = FlashKernel::kAuto;
  EXPECT_EQ(error_of(p.inputs(), params), "");
}

TEST_F(BadInput, MismatchedBatch) {
  Tensor k(DType::kF32, {3, 24, 2, 32});
  AttentionInputs in = p.inputs();
  in.k = k;
  EXPECT_EQ(error_of(in, p.params()), "k dimension 0 (batch) is 3, expected 2 (q's batch) (shape (3, 24, 2, 32))");
}

TEST_F(BadInput, MismatchedHeadDim) {
  Tensor k(DType::kF32, {2, 24, 2, 16});
  AttentionInputs in = p.inputs();
  in.k = k;
  EXPECT_NE(error_of(in, p.params()).find("k dimension 3 (head_dim) is 16, expected 32"), std::string::npos);
}

TEST_F(BadInput, ValueLengthDiffersFromKey) {
  Tensor v(DType::kF32, {2, 23, 2, 32});
  AttentionInputs in = p.inputs();
  in.v = v;
  EXPECT_NE(error_of(in, p.params()).find("v dimension 1 (kv_len) is 23, expected 24"), std::string::npos);
}

TEST_F(BadInput, QueryHeadsNotAMultipleOfKvHeads) {
  Tensor k(DType::kF32, {2, 24, 3, 32}), v(DType::kF32, {2, 24, 3, 32});
  AttentionInputs in = p.inputs();
  in.k = k;
  in.v = v;
  EXPECT_NE(error_of(in, p.params()).find("q dimension 2 (q_heads) is 4, expected a multiple of k dimension 2 (kv_heads) = 3"),
            std::string::npos);
}

TEST_F(BadInput, UnsupportedHeadDim) {
  Tensor q(DType::kF32, {2, 16, 4, 300}), k(DType::kF32, {2, 24, 2, 300});
  AttentionInputs in = p.inputs();
  in.q = q;
  in.k = k;
  EXPECT_NE(error_of(in, p.params()).find("q dimension 3 (head_dim) is 300: unsupported head dim, expected 1 to 256 here; "
                                          "sdpa takes any"), std::string::npos);
}

TEST_F(BadInput, MaskOfWrongShape) {
  Tensor mask(DType::kU8, {2, 1, 15, 24});
  AttentionInputs in = p.inputs();
  in.mask = mask;
  EXPECT_NE(error_of(in, p.params()).find("mask dimension 2 is 15"), std::string::npos) << error_of(in, p.params());
}

// A float mask of 0 / -inf is PyTorch's additive attn_mask: the refusal says to pass it as the bias, which it is.
TEST_F(BadInput, FloatMaskIsNamedTheBiasItIs) {
  Tensor mask(DType::kF32, {2, 1, 16, 24});
  AttentionInputs in = p.inputs();
  in.mask = mask;
  const std::string error = error_of(in, p.params());
  EXPECT_NE(error.find("mask has dtype f32, expected bool/u8 (a float mask that is added to the logits"), std::string::npos)
      << error;
  EXPECT_NE(error.find("is a bias: pass it as the bias"), std::string::npos) << error;
}

TEST_F(BadInput, BiasOfWrongDtype) {
  Tensor bias(DType::kF16, {2, 4, 16, 24});
  AttentionInputs in = p.inputs();
  in.bias = bias;
  EXPECT_NE(error_of(in, p.params()).find("bias has dtype f16, expected f32"), std::string::npos);
}

TEST_F(BadInput, NegativeWindow) {
  AttentionParams params = p.params();
  params.window_left = -5;
  EXPECT_NE(error_of(p.inputs(), params).find("sliding window (-5, -1) has a negative size"), std::string::npos);
}

TEST_F(BadInput, WrongRank) {
  Tensor q(DType::kF32, {16, 4, 32});
  AttentionInputs in = p.inputs();
  in.q = q;
  EXPECT_NE(error_of(in, p.params()).find("q has rank 3"), std::string::npos);
}

TEST_F(BadInput, SegmentIdsOnOneSideOnly) {
  Tensor seg(DType::kI32, {2, 16});
  AttentionInputs in = p.inputs();
  in.q_segment_ids = seg;
  EXPECT_NE(error_of(in, p.params()).find("segment ids need both"), std::string::npos);
}

TEST_F(BadInput, ErrorCarriesFileAndLine) {
  Tensor k(DType::kF32, {3, 24, 2, 32});
  AttentionInputs in = p.inputs();
  in.k = k;
  try {
    AttentionRegistry::builtin().create("sdpa", Backend::kCpu)->forward(in, p.params());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("validate.cc:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ra::test
