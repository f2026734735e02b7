// The manifest of an output file: shapes, dtypes, the run's parameters and one checksum per dataset,
// stored as a JSON attribute `manifest` and checked by `ringattn verify`. The checksum is a sum over
// elements of a hash of (global element index, element bits), so every rank adds its own slice and
// one all-reduce gives the whole file's value, whatever the layout or mesh that wrote it.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>

#include "launch/sharded_io.h"

namespace ra::cli {

struct OutputChecksums {
  uint64_t o = 0, lse = 0;
};

// The checksums of the whole datasets from this rank's slices (collective over `comm`).
OutputChecksums output_checksums(const ShardPlan& plan, const TensorView& o, const TensorView& lse, MPI_Comm comm);

std::string manifest_json(const ShardPlan& plan, DType o_dtype, const OutputChecksums& sums,
                          const std::map<std::string, std::string>& attributes);

// Throws (naming the dataset) when the file's manifest is absent or its checksums differ from `sums`.
void check_manifest(const std::string& manifest, const OutputChecksums& sums, const std::string& path);

}  // namespace ra::cli
