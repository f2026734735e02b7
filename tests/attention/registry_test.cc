// The registry: names and aliases, backends, and errors that name what is missing.
#include "attention/registry.h"
#include "attention/ring/ring.h"

#include <gtest/gtest.h>

#include "runtime/error.h"

namespace ra {
namespace {

TEST(Registry, ListsTheSeedsImplementations) {
  auto names = AttentionRegistry::builtin().list_implementations();
  for (const char* n : {"blockwise", "flash_attn2", "sdpa"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

TEST(Registry, AliasesResolveToTheCanonicalName) {
  const auto& r = AttentionRegistry::builtin();
  EXPECT_EQ(r.canonical_name("flash"), "flash_attn2");
  EXPECT_EQ(r.create("scaled_dot_product_attention", Backend::kCpu)->name(), "sdpa");
  EXPECT_EQ(r.create("flash_attn2", Backend::kNative)->backend(), Backend::kNative);
}

TEST(Registry, UnknownNameListsWhatExists) {
  try {
    AttentionRegistry::builtin().create("splash", Backend::kCpu);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("'splash' is not registered; available: "), std::string::npos) << e.message();
  }
}

TEST(Registry, MissingBackendNamesImplementationAndBackend) {
  AttentionRegistry r;
  r.register_impl({"only_cpu"}, Backend::kCpu, [](const RingContext*) { return AttentionRegistry::builtin().create("sdpa", Backend::kCpu); });
  try {
    r.create("only_cpu", Backend::kCuda);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "attention implementation 'only_cpu' has no cuda backend (it has: cpu)");
  }
}

TEST(Registry, DuplicateRegistrationThrows) {
  AttentionRegistry r;
  auto make = [](const RingContext*) { return AttentionRegistry::builtin().create("sdpa", Backend::kCpu); };
  r.register_impl({"x"}, Backend::kCpu, make);
  EXPECT_THROW(r.register_impl({"x"}, Backend::kCpu, make), Error);
}

TEST(Registry, ParsesBackends) {
  EXPECT_EQ(parse_backend("cuda"), Backend::kCuda);
  EXPECT_THROW(parse_backend("tpu"), Error);
}

TEST(Registry, ParsesRingTransports) {
  for (RingTransport t : {RingTransport::kAuto, RingTransport::kNccl, RingTransport::kCopyEngines})
    EXPECT_EQ(parse_ring_transport(ring_transport_name(t)), t);
  try {
    parse_ring_transport("ipc");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected auto, nccl or copy-engines"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ra
