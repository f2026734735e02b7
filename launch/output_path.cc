// Where an output may be written: checked on every rank before any work (see output_path.h).
#include "launch/output_path.h"

#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <filesystem>

#include "runtime/error.h"

namespace ra::cli {

void check_output_path(const std::string& output, const std::string& input, bool overwrite, const char* label) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(output, ec);  // through symbolic links
  if (fs::exists(status)) {
    RA_CHECK(!fs::is_directory(status), label, " '", output, "' is a directory: name a file (e.g. '",
             (fs::path(output) / "out.h5").string(), "')");
    RA_CHECK(fs::is_regular_file(status), label, " '", output, "' exists and is not a regular file (a device, pipe "
             "or socket): ringattn replaces only regular files, even with --overwrite");
    RA_CHECK(input.empty() || !fs::equivalent(output, input, ec), label, " '", output, "' is the input file '", input,
             "' (same device and inode): writing it would destroy the input; name another output");
    RA_CHECK(overwrite, label, " '", output, "' exists; refusing to replace it (pass --overwrite)");
  }
  const fs::path dir = fs::absolute(output).parent_path();
  RA_CHECK(fs::is_directory(dir) || !fs::exists(dir), label, " '", output, "': '", dir.string(), "' is a file, not a "
           "directory");
  RA_CHECK(fs::is_directory(dir), label, " '", output, "': directory '", dir.string(), "' does not exist");
  RA_CHECK(::access(dir.c_str(), W_OK) == 0, label, " '", output, "': directory '", dir.string(), "' is not writable");
}

void check_output_space(const std::string& output, uint64_t bytes) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::absolute(output).parent_path();
  struct statvfs fs_info {};
  if (::statvfs(dir.c_str(), &fs_info) == 0) {
    const uint64_t free_bytes = uint64_t(fs_info.f_bavail) * fs_info.f_frsize;
    RA_CHECK(free_bytes >= bytes, "output '", output, "' needs about ", bytes, " bytes but the filesystem of '",
             dir.string(), "' has ", free_bytes, " bytes free (pass --no-space-check to try anyway)");
  }
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    RA_CHECK(uint64_t(limit.rlim_cur) >= bytes, "output '", output, "' needs about ", bytes,
             " bytes but this process may write files of at most ", uint64_t(limit.rlim_cur),
             " bytes (ulimit -f; pass --no-space-check to try anyway)");
}

}  // namespace ra::cli
