// A ring call's start: where its ranks agree that each can go on (collectives/call_agreement.h), before the
// call's first collective. A rank whose checks of the call fail before its start joins that agreement with
// its error instead (join_refused_call, from AttentionImpl::refuse_call), so every rank stops at once; one
// failing after the start does not: the others are exchanging by then and stop at their step timeout.
#pragma once

#include <chrono>
#include <exception>

#include "collectives/call_agreement.h"

namespace ra {

class RingCallStart {
 public:
  // Collective: throws ra::Error where a rank refused the call. `started` (the ring's) is set meanwhile.
  RingCallStart(Communicator& comm, std::chrono::milliseconds timeout, bool& started, const char* call)
      : started_(started) {
    agree_every_rank_goes_on(comm, timeout, nullptr, call);
    started_ = true;
  }
  ~RingCallStart() { started_ = false; }
  RingCallStart(const RingCallStart&) = delete;
  RingCallStart& operator=(const RingCallStart&) = delete;

 private:
  bool& started_;
};

// This rank refused a call of a ring not yet started: it joins the ranks' agreement with `refused`, which
// the caller then raises.
inline void join_refused_call(Communicator& comm, std::chrono::milliseconds timeout, bool started,
                              const std::exception_ptr& refused) {
  if (!started) agree_every_rank_goes_on(comm, timeout, refused, "ring");
}

}  // namespace ra
