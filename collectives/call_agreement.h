// Before a collective call's first exchange its ranks agree that every one of them can go on. A rank that
// refused the call (its arguments failed their checks) brings its reason to the agreement, and every rank
// then stops at once, each naming that rank and reason, instead of the others waiting for it at their
// first exchange until the timeout and then saying only that no data came.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>

#include "collectives/communicator.h"

namespace ra {

// An all-reduce of int64 values in place over the call's ranks (bounded by the call's timeout).
using AgreementAllReduce = std::function<void(int64_t* data, size_t count, ReduceOp op)>;

// Collective: one all-reduce where no rank refused, two where one did. `refused`: this rank's reason, or
// null where it can go on. Returns where no rank refused, and on a rank that refused (it raises its own
// error, so an all-reduce that fails there is not raised in its place); throws ra::Error on the other ranks,
// naming the lowest refusing rank and its reason. `least`:
// values the ranks agree on in the same all-reduce, replaced by their least over the ranks (where no rank
// refused).
void agree_every_rank_goes_on(const AgreementAllReduce& all_reduce, int rank, int size,
                              const std::exception_ptr& refused, const std::string& call,
                              std::span<int64_t> least = {});

// The same over `comm`, every all-reduce bounded by `timeout`.
void agree_every_rank_goes_on(Communicator& comm, std::chrono::milliseconds timeout,
                              const std::exception_ptr& refused, const std::string& call);

// What an exception says: an ra::Error's message (without its file:line), else what().
std::string reason_of(const std::exception_ptr& error);

}  // namespace ra
