// MPI_Init_thread / MPI_Finalize in RAII form, with the node-local rank.
#include "collectives/mpi_session.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "collectives/mpi_check.h"

namespace ra {
namespace {

MPI_Comm g_error_agreement = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD used only on the way out

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    RA_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided_));
    owns_ = true;
  } else {
    MPI_Query_thread(&provided_);  // an embedding program owns MPI
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm node;
  RA_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_free(&node);
  if (g_error_agreement == MPI_COMM_NULL) RA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_error_agreement));
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

void MpiSession::abort_job_after_peers(int code, double seconds) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized && g_error_agreement != MPI_COMM_NULL) {
    MPI_Request request;
    if (MPI_Ibarrier(g_error_agreement, &request) == MPI_SUCCESS) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
      int done = 0;
      while (!done && std::chrono::steady_clock::now() < deadline) {
        if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }
  abort_job(code);
}

void MpiSession::abort_job(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace ra
