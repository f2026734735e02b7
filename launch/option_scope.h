// Where each option applies: options that shape only some implementations' work, given where they would
// change nothing, are refused by name (a user who passes an option expects its effect; ignoring it in
// silence would run something else than asked). Apart from cli_options (which the CLI fuzzer links alone):
// it asks the registry for an implementation's canonical name.
#pragma once

#include <initializer_list>

#include "launch/cli_options.h"

namespace ra::cli {

// --block-q / --block-k apply to blockwise; --local-impl, --layout, --no-block-checksums and --grad-wire to the
// ring; --ring-transport and bench's --step-times to the GPU ring; --dropout-seed needs --dropout. Reads opts.given
// (parse).
void check_options_apply(const AttentionOptions& opts);

// The command's options that shape only the backward pass (run's --do-dataset, bench's --f32-gradients, ...), given
// without --backward: refused, each by name. Reads opts.given.
void check_backward_options_apply(const AttentionOptions& opts, bool backward,
                                  std::initializer_list<const char*> options);

}  // namespace ra::cli
