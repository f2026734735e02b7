// The checks every file ringattn writes passes before any work: run's and generate's outputs, bench's JSON.
#pragma once

#include <cstdint>
#include <string>

namespace ra::cli {

// The output must be creatable: its directory exists and is writable, it is not `input` (by device and inode:
// another path to the same file counts; none where input is empty), it is not a directory, device, pipe or socket,
// and it is not there already unless `overwrite`. `label` names it in errors ("output", "--json").
void check_output_path(const std::string& output, const std::string& input, bool overwrite, const char* label = "output");

// A full disk found before the compute rather than in the middle of the write: the free space of the output's
// filesystem and the process's file-size limit must hold `bytes`.
void check_output_space(const std::string& output, uint64_t bytes);

}  // namespace ra::cli
