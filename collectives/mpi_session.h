// The MPI session: the only place that calls MPI_Init_thread / MPI_Finalize. It asks for
// MPI_THREAD_SERIALIZED (the ring's exchange thread makes MPI calls while the main thread computes,
// never at the same time) and records what the library provides. Works under mpirun and as a
// singleton. Not copyable; one per process.
#pragma once

#include <mpi.h>

namespace ra {

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  int thread_level() const { return provided_; }
  bool owns_mpi() const { return owns_; }
  // Rank among the processes of this node (for choosing a GPU).
  int local_rank() const { return local_rank_; }
  // Ends every rank of the job with `code`: the fail-stop path when one rank cannot go on.
  [[noreturn]] static void abort_job(int code);
  // The same after giving the other ranks up to `seconds` to reach this point too: for an error that
  // every rank finds alike (bad input, checked before any exchange), so that each prints its own message
  // before the abort ends it. Agreement runs on a communicator of its own (no clash with a collective
  // another rank may be in).
  [[noreturn]] static void abort_job_after_peers(int code, double seconds);

 private:
  bool owns_ = false;
  int rank_ = 0, size_ = 1, provided_ = MPI_THREAD_SINGLE, local_rank_ = 0;
};

}  // namespace ra
