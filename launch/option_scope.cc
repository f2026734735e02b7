#include "launch/option_scope.h"

#include "attention/registry.h"
#include "attention/ring/ring.h"
#include "runtime/error.h"

namespace ra::cli {

void check_options_apply(const AttentionOptions& o) {
  const std::string impl = AttentionRegistry::builtin().canonical_name(o.impl);
  const bool ring = impl == "ring", gpu_ring = ring && parse_backend(o.backend) == Backend::kCuda;
  (void)parse_ring_transport(o.ring_transport);  // an unknown name is named as such first
  auto given = [&](const char* option) { return was_given(o, option); };
  auto applies = [&](bool where, const char* option, const char* to) {
    RA_CHECK(where || !given(option), "--", option, " applies to ", to, ", not to --impl ", impl, " on --backend ",
             o.backend, ", where it would change nothing: leave it out");
  };
  applies(impl == "blockwise", "block-q", "--impl blockwise (its query chunk)");
  applies(impl == "blockwise", "block-k", "--impl blockwise (its key chunk)");
  applies(ring, "local-impl", "--impl ring (the kernel of each ring step)");
  applies(ring, "layout", "--impl ring (which tokens each rank holds)");
  applies(ring, "no-block-checksums", "--impl ring (the blocks in flight)");
  applies(ring, "grad-wire", "--impl ring (the dK/dV accumulators in flight)");
  applies(gpu_ring, "ring-transport", "the GPU ring (--impl ring --backend cuda; the host ring sends over MPI)");
  applies(gpu_ring, "step-times", "the GPU ring (--impl ring --backend cuda: its steps' device times)");  // bench's
  RA_CHECK(given("dropout") || !given("dropout-seed"), "--dropout-seed ", o.seed,
           " without --dropout: no pair is dropped, so the seed would change nothing (add --dropout P)");
}

void check_backward_options_apply(const AttentionOptions& o, bool backward,
                                  std::initializer_list<const char*> options) {
  for (const char* option : options)
    RA_CHECK(backward || !was_given(o, option), "--", option, " applies to the backward pass, where it would change "
             "nothing without it: add --backward, or leave it out");
}

}  // namespace ra::cli
