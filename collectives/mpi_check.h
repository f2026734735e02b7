// RA_MPI_CHECK: turns a failed MPI call into an ra::Error with the call and MPI's own message.
#pragma once

#include <mpi.h>

#include <string>

#include "runtime/error.h"

namespace ra {
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, size_t(len));
}
}  // namespace ra

#define RA_MPI_CHECK(call)                                                         \
  do {                                                                             \
    int ra_mpi_status_ = (call);                                                   \
    if (ra_mpi_status_ != MPI_SUCCESS) RA_FAIL(#call, " failed: ", ::ra::mpi_error_string(ra_mpi_status_)); \
  } while (0)
