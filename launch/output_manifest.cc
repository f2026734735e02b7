// Output manifest and order-independent checksums.
#include "launch/output_manifest.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/error.h"

namespace ra::cli {
namespace {

uint64_t mix(uint64_t x) {  // SplitMix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t element_bits(const char* p, size_t size) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, size);
  return bits;
}

std::string hex(uint64_t v) {
  std::ostringstream out;
  out << std::hex << v;
  return out.str();
}

}  // namespace

OutputChecksums output_checksums(const ShardPlan& p, const TensorView& o, const TensorView& lse, MPI_Comm comm) {
  const std::vector<int64_t> rows = layout_indices(p.layout, p.q_len, p.sp_size, p.sp_index);  // = p.q_runs
  const size_t o_size = dtype_size(o.dtype());
  uint64_t sums[2] = {0, 0};
  const char* od = static_cast<const char*>(o.data());
  for (int64_t b = 0; b < p.b_count; ++b)
    for (size_t t = 0; t < rows.size(); ++t)
      for (int64_t h = 0; h < p.hq_count; ++h)
        for (int64_t d = 0; d < p.v_head_dim; ++d) {
          const int64_t local = ((b * int64_t(rows.size()) + int64_t(t)) * p.hq_count + h) * p.v_head_dim + d;
          const int64_t global = (((p.b_offset + b) * p.q_len + rows[t]) * p.q_heads + p.hq_offset + h) * p.v_head_dim + d;
          sums[0] += mix(uint64_t(global) * 0x9e3779b97f4a7c15ull ^ element_bits(od + local * int64_t(o_size), o_size));
        }
  const char* ld = static_cast<const char*>(lse.data());
  for (int64_t b = 0; b < p.b_count; ++b)
    for (int64_t h = 0; h < p.hq_count; ++h)
      for (size_t t = 0; t < rows.size(); ++t) {
        const int64_t local = (b * p.hq_count + h) * int64_t(rows.size()) + int64_t(t);
        const int64_t global = ((p.b_offset + b) * p.q_heads + p.hq_offset + h) * p.q_len + rows[t];
        sums[1] += mix(uint64_t(global) * 0x9e3779b97f4a7c15ull ^ element_bits(ld + local * 4, 4));
      }
  MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_UINT64_T, MPI_SUM, comm);
  return {sums[0], sums[1]};
}

std::string manifest_json(const ShardPlan& p, DType o_dtype, const OutputChecksums& sums,
                          const std::map<std::string, std::string>& attributes) {
  const Shape file_o = qkv_shape(p.names.format, p.batch, p.q_len, p.q_heads, p.v_head_dim);
  const std::vector<int64_t> o_shape(file_o.dims.begin(), file_o.dims.begin() + file_o.rank);
  nlohmann::json m = {
      {"format", "ringattn-output-1"},
      {"datasets",
       {{"o", {{"shape", o_shape}, {"dtype", dtype_name(o_dtype)}, {"checksum", hex(sums.o)}}},
        {"lse", {{"shape", {p.batch, p.q_heads, p.q_len}}, {"dtype", "f32"}, {"checksum", hex(sums.lse)}}}}},
      {"run", attributes}};
  return m.dump();
}

void check_manifest(const std::string& manifest, const OutputChecksums& sums, const std::string& path) {
  RA_CHECK(!manifest.empty(), "output '", path, "' has no manifest attribute (not written by ringattn run, or "
           "written by an older version)");
  const nlohmann::json m = nlohmann::json::parse(manifest, nullptr, false);
  RA_CHECK(!m.is_discarded() && m.contains("datasets"), "output '", path, "': the manifest attribute is not valid JSON");
  for (auto [name, value] : {std::pair{"o", sums.o}, std::pair{"lse", sums.lse}}) {
    const std::string stored = m["datasets"][name].value("checksum", "");
    RA_CHECK(stored == hex(value), "output '", path, "' dataset '", name, "': checksum ", hex(value),
             " does not match the manifest's ", stored, " (the file changed or was corrupted after it was written)");
  }
}

}  // namespace ra::cli
