// The registry: names and aliases, backends, and errors that name what is missing.
#include "attention/registry.h"
#include "attention/ring/ring.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "runtime/error.h"
#include "tests/support/problem.h"

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

// An implementation whose accumulate waits until released, to hold a call open on one thread.
class HeldOpen final : public AttentionImpl {
 public:
  std::string_view name() const override { return "held_open"; }
  Backend backend() const override { return Backend::kCpu; }
  void accumulate(const AttentionInputs&, const TokenPositions&, const AttentionParams&, Carry&) const override {
    entered.set_value();
    release.wait();
  }
  mutable std::promise<void> entered;
  std::shared_future<void> release;
};

// One object serves one call at a time: another thread's call while one runs is refused by name (it
// would race on the object's state), the running call is unharmed, and once it ends any thread may call.
TEST(OneCallAtATime, AnotherThreadsCallIsRefusedWhileOneRuns) {
  test::Problem p(test::ProblemSpec{1, 8, 8, 2, 2, 16, 16});
  HeldOpen impl;
  std::promise<void> release;
  impl.release = release.get_future().share();
  std::thread first([&] { impl.forward(p.inputs(), p.params()); });
  impl.entered.get_future().wait();
  try {
    impl.forward(p.inputs(), p.params());
    ADD_FAILURE() << "a second thread's call ran while the first was inside";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "implementation 'held_open' on cpu is running a call on another thread: one object serves "
              "one call at a time (it keeps buffers and state between calls); make one object per thread");
  }
  release.set_value();
  first.join();
  impl.entered = std::promise<void>();
  std::thread([&] { impl.forward(p.inputs(), p.params()); }).join();  // free again, for any thread
}

}  // namespace
}  // namespace ra
