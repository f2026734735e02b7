// ra::Error keeps the bare message (for tests and CLI output) and prefixes what() with file:line.
#include "runtime/error.h"

#include <filesystem>

namespace ra {

Error::Error(const char* file, int line, const std::string& message)
    : std::runtime_error(std::filesystem::path(file).filename().string() + ":" + std::to_string(line) + ": " +
                         message),
      message_(message) {}

}  // namespace ra
