// The end of an MPI GoogleTest main: one rank prints, every rank asserts, and the exit code is the
// worst over all ranks (so mpirun reports a failure seen on any rank).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

namespace ra::test {

inline int run_tests_on_every_rank(int rank) {
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int result = RUN_ALL_TESTS();
  int any = result;
  MPI_Allreduce(&result, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}

}  // namespace ra::test
