// The ringattn CLI: generate | run | verify | bench. One MPI session; any error is printed with the
// rank and ends every rank of the job with a non-zero code (no rank is left waiting on it).
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>

#include "launch/commands.h"
#include "runtime/activity.h"
#include "runtime/error.h"

namespace {

const char* kUsage =
    "ringattn: distributed ring attention\n"
    "Usage: [mpirun -np N] ringattn <command> [options]   (each command takes --help)\n"
    "  generate  write random q, k, v (and optional mask, bias, segment ids) to an HDF5 file\n"
    "  run       attention over the ranks (ring by default) from an HDF5 file to an HDF5 file\n"
    "  verify    check an output file against the f64 reference; non-zero exit on any wrong element\n"
    "  bench     time an implementation on synthetic data (time, GFLOP/s per rank, hidden communication)\n";

}  // namespace

int main(int argc, char** argv) {
  // Past a file-size limit a write must fail like a full disk (reported, no file left), not kill the rank.
  std::signal(SIGXFSZ, SIG_IGN);
  ra::MpiSession mpi(&argc, &argv);
  ra::install_activity_report(mpi.world_rank());
  int code = ra::cli::kOk;
  try {
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
      if (mpi.world_rank() == 0) std::fputs(kUsage, stdout);
      return argc < 2 ? ra::cli::kBadInput : ra::cli::kOk;
    }
    const char* command = argv[1];
    if (!std::strcmp(command, "generate")) {
      code = ra::cli::cmd_generate(argc - 1, argv + 1, mpi);
    } else if (!std::strcmp(command, "run")) {
      code = ra::cli::cmd_run(argc - 1, argv + 1, mpi);
    } else if (!std::strcmp(command, "verify")) {
      code = ra::cli::cmd_verify(argc - 1, argv + 1, mpi);
    } else if (!std::strcmp(command, "bench")) {
      code = ra::cli::cmd_bench(argc - 1, argv + 1, mpi);
    } else {
      RA_FAIL("unknown command '", command, "'\n", kUsage);
    }
  } catch (const ra::Error& e) {
    std::fprintf(stderr, "[rank %d] ringattn: error: %s\n", mpi.world_rank(), e.message().c_str());
    std::fflush(stderr);
    ra::remove_partial_output();
    // Every rank checks its input alike: let each print its own message before the job ends.
    if (mpi.world_size() > 1) ra::MpiSession::abort_job_after_peers(ra::cli::kBadInput, 5.0);
    return ra::cli::kBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] ringattn: error: %s\n", mpi.world_rank(), e.what());
    std::fflush(stderr);
    ra::remove_partial_output();
    if (mpi.world_size() > 1) ra::MpiSession::abort_job(ra::cli::kRuntimeFailure);
    return ra::cli::kRuntimeFailure;
  }
  return code;
}
