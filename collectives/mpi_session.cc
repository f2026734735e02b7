// MPI_Init_thread / MPI_Finalize in RAII form, with the node-local rank.
#include "collectives/mpi_session.h"

#include <cstdlib>

#include "collectives/mpi_check.h"

namespace ra {

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
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

void MpiSession::abort_job(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace ra
