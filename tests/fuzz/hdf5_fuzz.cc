// libFuzzer target: the HDF5 input loader (open, check shapes and dtypes, plan this rank's slice,
// read it) on arbitrary file bytes. Bad files must give ra::Error, never a crash or a read past a
// buffer. The seed corpus is a valid small input file.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "launch/sharded_io.h"
#include "runtime/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/ringattn_fuzz_" + std::to_string(getpid()) + ".h5";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    return 0;
  }
  try {
    ra::H5File file(path, ra::H5File::Mode::kRead);
    const ra::MeshShape mesh = ra::MeshShape::parse("sp=2");
    for (int rank = 0; rank < 2; ++rank) {
      const ra::cli::ShardPlan plan = ra::cli::plan_shards(file, mesh, rank, ra::SequenceLayout::kZigzag);
      // Bound the work: a fuzzed header may claim huge shapes that are valid but slow to read.
      // In double: a fuzzed shape's product overflows int64 and could wrap below the bound.
      const double len = double(std::max(plan.q_len, plan.kv_len)), heads = double(std::max(plan.q_heads, plan.kv_heads));
      const double dim = double(std::max(plan.head_dim, plan.v_head_dim)), batch = double(plan.batch);
      if (batch * len * heads * dim > double(1 << 20) || batch * heads * len * len > double(1 << 22)) break;
      (void)ra::cli::read_local(file, plan);
    }
  } catch (const ra::Error&) {
  }
  return 0;
}
