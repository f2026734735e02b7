#include "collectives/call_agreement.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/error.h"

namespace ra {
namespace {
// The refusing rank's reason travels as int64 words (the one element type every back end reduces),
// summed with every other rank's zeros; long reasons are cut.
constexpr size_t kReasonWords = 128;
}  // namespace

std::string reason_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an error that is not a std::exception";
  }
}

namespace {

void agree(const AgreementAllReduce& all_reduce, int rank, int size, const std::exception_ptr& refused,
           const std::string& call, std::span<int64_t> least) {
  std::vector<int64_t> first(1 + least.size());
  first[0] = refused ? rank : size;  // becomes the lowest refusing rank, or size where none refused
  std::copy(least.begin(), least.end(), first.begin() + 1);
  all_reduce(first.data(), first.size(), ReduceOp::kMin);
  const int64_t first_refusing = first[0];
  if (first_refusing == size) {
    std::copy(first.begin() + 1, first.end(), least.begin());
    return;
  }
  std::vector<int64_t> words(1 + kReasonWords, 0);  // the reason's length, then its bytes
  if (rank == first_refusing) {
    const std::string reason = reason_of(refused);
    const size_t bytes = std::min(reason.size(), kReasonWords * sizeof(int64_t));
    words[0] = int64_t(bytes);
    std::memcpy(words.data() + 1, reason.data(), bytes);
  }
  all_reduce(words.data(), words.size(), ReduceOp::kSum);
  if (refused) return;  // this rank raises its own error
  const size_t bytes = size_t(std::clamp<int64_t>(words[0], 0, kReasonWords * sizeof(int64_t)));
  const std::string reason(reinterpret_cast<const char*>(words.data() + 1), bytes);
  RA_FAIL(call, ": rank ", first_refusing, " of ", size, " refused its part of the call, so every rank stops before "
          "any exchange; rank ", first_refusing, " says: ", reason);
}

}  // namespace

void agree_every_rank_goes_on(const AgreementAllReduce& all_reduce, int rank, int size,
                              const std::exception_ptr& refused, const std::string& call,
                              std::span<int64_t> least) {
  if (size == 1) return;
  if (!refused) return agree(all_reduce, rank, size, nullptr, call, least);
  try {  // the caller raises `refused`, whatever becomes of the agreement (a rank gone, a timeout)
    agree(all_reduce, rank, size, refused, call, least);
  } catch (...) {
  }
}

void agree_every_rank_goes_on(Communicator& comm, std::chrono::milliseconds timeout,
                              const std::exception_ptr& refused, const std::string& call) {
  const std::string what = call + ": the ranks' agreement to start";
  agree_every_rank_goes_on(
      [&](int64_t* data, size_t count, ReduceOp op) { comm.all_reduce_within(data, count, op, timeout, what.c_str()); },
      comm.rank(), comm.size(), refused, call);
}

}  // namespace ra
