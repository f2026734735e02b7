// Slices as HDF5 selections: one hyperslab per run of the layout, batch and head ranges from the
// NamedSharding of the dp and tp axes.
#include "launch/sharded_io.h"

#include "launch/output_manifest.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "attention/misread_format.h"
#include "mesh/sharding.h"
#include "runtime/activity.h"
#include "runtime/error.h"

namespace ra::cli {
namespace {

std::string where(const H5File& f, const std::string& dataset) { return "dataset '" + dataset + "' of '" + f.path() + "'"; }

// What a file that lacks dataset `missing` holds instead: "; it holds a, b/q" (the first few), and where one in a
// group bears the missing name, that a path names it ("; it holds no dataset" for a file without any).
std::string what_the_file_holds(const H5File& f, const std::string& missing) {
  constexpr size_t kShown = 12;
  const std::vector<std::string> paths = f.dataset_paths(kShown + 1);
  if (paths.empty()) return "; it holds no dataset";
  std::string text = "; it holds ";
  for (size_t i = 0; i < std::min(paths.size(), kShown); ++i) text += (i ? ", " : "") + paths[i];
  if (paths.size() > kShown) text += ", ...";
  const std::string base = missing.substr(missing.find_last_of('/') + 1);
  for (const std::string& path : paths)
    if (path.size() > base.size() && path.compare(path.size() - base.size(), base.size(), base) == 0 &&
        path[path.size() - base.size() - 1] == '/')
      return text + " (a dataset in a group is named by its path: '" + path + "'; see the --*-dataset options)";
  return text;
}

DatasetInfo required(const H5File& f, const std::string& name, int rank, const std::string& layout,
                     const char* rank_hint = "") {
  RA_CHECK(f.has(name), "input '", f.path(), "' has no dataset '", name, "' ", layout, what_the_file_holds(f, name));
  DatasetInfo info = f.info(name);
  RA_CHECK(info.shape.rank == rank, where(f, name), " has rank ", info.shape.rank, " (shape ", info.shape.str(),
           "), expected ", rank, " ", layout, rank_hint);
  return info;
}

// The dataset's element type must be one of `allowed`; the error names what the file holds.
void expect_dtype(const H5File& f, const std::string& name, const DatasetInfo& info, std::initializer_list<DType> allowed,
                  const char* expected) {
  const bool ok = info.supported && std::find(allowed.begin(), allowed.end(), info.dtype) != allowed.end();
  // numpy has no bfloat16: its bits stored as 16-bit integers (torch's .view(torch.int16)) are the likely cause.
  const bool bf16_bits = (info.type_name == "uint16" || info.type_name == "int16") &&
                         std::find(allowed.begin(), allowed.end(), DType::kBF16) != allowed.end();
  RA_CHECK(ok, where(f, name), " holds ", info.type_name, ", expected ", expected,
           " (ringattn never converts: write it as one of those, e.g. numpy's .astype",
           bf16_bits ? "; bfloat16 bits stored as integers? the README's \"HDF5 layout\" shows how h5py writes a "
                       "bfloat16 dataset"
                     : "",
           ")");
}

// q, k, v, o and the gradients: one of the floating dtypes the kernels take.
void expect_float(const H5File& f, const std::string& name, const DatasetInfo& info) {
  expect_dtype(f, name, info, {DType::kF32, DType::kF16, DType::kBF16}, "float32, float16 or bfloat16");
}

// Zero-length dimensions leave nothing to attend: refused by name before any read.
void expect_nonempty(const H5File& f, const std::string& name, const DatasetInfo& info, const char* dim_names) {
  for (int d = 0; d < info.shape.rank; ++d)
    RA_CHECK(info.shape[d] > 0, where(f, name), " has shape ", info.shape.str(), ": dimension ", d, " of ", dim_names,
             " is 0, expected at least 1");
}

void expect_dim(const H5File& f, const std::string& name, const DatasetInfo& info, int dim, const char* dim_name,
                int64_t expected, const char* because, const std::string& hint = "") {
  RA_CHECK(info.shape[dim] == expected, where(f, name), " dimension ", dim, " (", dim_name, ") is ", info.shape[dim],
           ", expected ", expected, " ", because, hint);
}

// The file's dimensions as (B, L, H, X)'s (0 batch, 1 len, 2 heads, 3 dim), in the file's order.
std::vector<int> file_dims(QkvFormat format) {
  switch (format) {
    case QkvFormat::kBHSD: return {0, 2, 1, 3};
    case QkvFormat::kSBHD: return {1, 0, 2, 3};
    case QkvFormat::kTHD: return {1, 2, 3};
    case QkvFormat::kBSHD: break;
  }
  return {0, 1, 2, 3};
}

// Where (B, L, H, X)'s dimension `dim` sits in the file (-1: thd has no batch dimension).
int file_dim(QkvFormat format, int dim) {
  const std::vector<int> dims = file_dims(format);
  for (size_t d = 0; d < dims.size(); ++d)
    if (dims[d] == dim) return int(d);
  return -1;
}

// The size of (B, L, H, X)'s `dim` in a file's shape (thd's batch: 1).
int64_t size_of(QkvFormat format, const Shape& shape, int dim) {
  const int d = file_dim(format, dim);
  return d < 0 ? 1 : shape[d];
}

// "(batch, q_len, q_heads, head_dim)" in the file's order.
std::string dims_text(QkvFormat format, const char* len, const char* heads, const char* x) {
  const char* names[4] = {"batch", len, heads, x};
  std::string text;
  for (int d : file_dims(format)) text += (text.empty() ? "(" : ", ") + std::string(names[d]);
  return text + ")";
}

// A shape that is the expected one in another format: the file holds that one (named, with the option to read it).
std::string format_hint(QkvFormat format, const Shape& found, const Shape& canonical_expected) {
  const Shape& e = canonical_expected;
  for (QkvFormat other : kQkvFormats) {
    if (other == format || (other == QkvFormat::kTHD && e[0] != 1)) continue;
    if (found == qkv_shape(other, e[0], e[1], e[2], e[3]) && !(found == qkv_shape(format, e[0], e[1], e[2], e[3])))
      return std::string(" (the shape of ") + qkv_format_name(other) + " " + dims_text(other, "len", "heads", "dim") +
             ": --qkv-format " + qkv_format_name(other) + " reads the files so)";
  }
  return "";
}

// Whether q, k and v's shapes agree as `format` reads them: batch and head_dim alike, v's len and heads k's, q's
// heads a multiple of k's.
bool shapes_agree(QkvFormat format, const Shape& q, const Shape& k, const Shape& v) {
  const int rank = int(file_dims(format).size());
  if (q.rank != rank || k.rank != rank || v.rank != rank) return false;
  auto size = [&](const Shape& s, int dim) { return size_of(format, s, dim); };
  return size(k, 2) > 0 && size(k, 0) == size(q, 0) && size(v, 0) == size(q, 0) && size(k, 3) == size(q, 3) &&
         size(v, 1) == size(k, 1) && size(v, 2) == size(k, 2) && size(q, 2) % size(k, 2) == 0;
}

// An output dataset of a (B, L, H, X) tensor: present, of `canonical`'s shape in the file's format (naming another
// format whose shape it has), floating point.
void expect_token_output(const H5File& f, QkvFormat format, const char* name, const Shape& canonical,
                         const std::string& dims) {
  const Shape shape = qkv_shape(format, canonical[0], canonical[1], canonical[2], canonical[3]);
  RA_CHECK(f.has(name), "output '", f.path(), "' has no dataset '", name, "' ", dims);
  const DatasetInfo info = f.info(name);
  RA_CHECK(info.shape == shape, where(f, name), " has shape ", info.shape.str(), ", expected ", shape.str(), " ", dims,
           format_hint(format, info.shape, canonical));
  expect_float(f, name, info);
}

// A selection of a (B, L, H, X) tensor's dataset: batch and head ranges, the given runs along L.
Selection select_tokens(const ShardPlan& p, const std::vector<IndexRun>& runs, int64_t h_off, int64_t h_count,
                        int64_t x) {
  const std::vector<int> dims = file_dims(p.names.format);
  Selection sel;
  for (const IndexRun& r : runs) {
    const int64_t start[4] = {p.b_offset, r.start, h_off, 0}, count[4] = {p.b_count, r.count, h_count, x},
                  stride[4] = {1, r.stride, 1, 1};
    Hyperslab slab;
    for (int d : dims) {
      slab.start.push_back(start[d]);
      slab.count.push_back(count[d]);
      slab.stride.push_back(stride[d]);
    }
    sel.push_back(std::move(slab));
  }
  return sel;
}

int64_t run_rows(const std::vector<IndexRun>& runs) {
  int64_t n = 0;
  for (const IndexRun& r : runs) n += r.count;
  return n;
}

// This rank's slice of a token-major tensor, in memory's (B, rows, H, X) whatever the file's format. (HDF5 reads the
// selection in the file's row-major order.)
Tensor read_tokens(const H5File& f, const std::string& name, const ShardPlan& p, const std::vector<IndexRun>& runs,
                   int64_t h_off, int64_t h_count, int64_t x, MemoryKind memory = MemoryKind::kHost) {
  const QkvFormat format = p.names.format;
  const Shape local{p.b_count, run_rows(runs), h_count, x};
  const Selection sel = select_tokens(p, runs, h_off, h_count, x);
  if (in_memory_order(format)) return f.read(name, sel, local, memory);
  const Tensor in_file = f.read(name, sel, qkv_shape(format, local[0], local[1], local[2], local[3]));
  return reorder_qkv(in_file.view(), format, /*to_format=*/false, memory);
}

// Creates a token-major output dataset in the file's format and writes this rank's (B, rows, H, X) slice into it.
void write_tokens(H5File& f, const char* name, const ShardPlan& p, int64_t len, int64_t heads,
                  const std::vector<IndexRun>& runs, int64_t h_off, int64_t h_count, const TensorView& t) {
  const QkvFormat format = p.names.format;
  const int64_t x = t.shape()[3];
  f.create_dataset(name, t.dtype(), qkv_shape(format, p.batch, len, heads, x));
  const Selection sel = select_tokens(p, runs, h_off, h_count, x);
  if (in_memory_order(format)) return f.write(name, sel, t);
  f.write(name, sel, reorder_qkv(t, format, /*to_format=*/true).view());
}

// lse (B, Hq, T): batch and head ranges, the query runs along T.
Selection select_lse(const ShardPlan& p) {
  Selection sel;
  for (const IndexRun& r : p.q_runs)
    sel.push_back({{p.b_offset, p.hq_offset, r.start}, {p.b_count, p.hq_count, r.count}, {1, 1, r.stride}});
  return sel;
}

// This rank's part of a (B|1, H|1, T|1, S) mask or bias: its batch, heads and query runs; size-1
// dimensions whole (shared with the ranks that split that dimension).
std::vector<IndexRun> pairwise_runs(const ShardPlan& p, const Shape& shape) {
  return shape[2] == 1 ? std::vector<IndexRun>{{0, 1, 1}} : p.q_runs;
}

// mask / bias: rank 1-4, broadcast as numpy does (missing leading dimensions are 1), each dimension 1 or
// the full size; rows are read by the query runs, size-1 dimensions whole.
DatasetInfo check_pairwise(const H5File& f, const std::string& name, const ShardPlan& p) {
  DatasetInfo info = f.info(name);
  RA_CHECK(info.shape.rank >= 1 && info.shape.rank <= 4, where(f, name), " has rank ", info.shape.rank,
           " (shape ", info.shape.str(), "), expected 1 to 4, broadcast to (batch, heads, q_len, kv_len)");
  const Shape shape = pairwise_shape(info.shape);
  const int64_t full[4] = {p.batch, p.q_heads, p.q_len, p.kv_len};
  const int leading = 4 - info.shape.rank;
  // A (batch, kv_len) key-padding mask (Hugging Face's attention_mask) broadcasts as numpy says, as (T, S).
  const bool padding_like = info.shape.rank == 2 && info.shape[0] == p.batch && p.batch != p.q_len;
  for (int d = leading; d < 4; ++d)
    RA_CHECK(shape[d] == 1 || shape[d] == full[d], where(f, name), " has shape ", info.shape.str(), ": dimension ",
             d - leading, " is ", shape[d], ", expected 1 or ", full[d], " to broadcast to (B, Hq, T, S) = (", full[0],
             ", ", full[1], ", ", full[2], ", ", full[3], ")",
             padding_like ? " (a key-padding mask of shape (batch, kv_len), as Hugging Face's attention_mask, is "
                            "stored as (batch, 1, 1, kv_len))"
                          : "");
  return info;
}

Tensor read_pairwise(const H5File& f, const std::string& name, const ShardPlan& p, MemoryKind memory) {
  DatasetInfo info = check_pairwise(f, name, p);
  return f.read(name, select_pairwise(p, info.shape), pairwise_local_shape(p, info.shape), memory);
}

// sinks / dsinks (Hq): this rank's heads.
Selection select_heads(const ShardPlan& p) { return {{{p.hq_offset}, {p.hq_count}, {1}}}; }

// The input's cu_seqlens, checked: packed sequences of one batch row, bounds from 0 to T never decreasing.
std::vector<int64_t> checked_cu_seqlens(const H5File& f, const DatasetNames& names, const ShardPlan& p) {
  const std::string at = where(f, names.cu_seqlens);
  RA_CHECK(!f.has(names.segment_ids), at, " and ", where(f, names.segment_ids), " are both given: give one (segment "
           "ids (batch, seq_len) of integers, or the cumulative lengths [0, l0, l0 + l1, ..., seq_len] of the sequences "
           "packed into one row)");
  RA_CHECK(p.batch == 1, at, " packs the sequences of one batch row, but q's batch is ", p.batch,
           ": write segment_ids (batch, seq_len) instead, or one row");
  RA_CHECK(p.q_len == p.kv_len, at, " needs q_len == kv_len (", p.q_len, " vs ", p.kv_len, ")");
  const std::vector<int64_t> cu = f.read_integers(names.cu_seqlens);
  RA_CHECK(cu.size() >= 2, at, " has ", cu.size(), " entries, expected at least 2 (0 and seq_len = ", p.q_len, ")");
  RA_CHECK(cu.front() == 0, at, " starts at ", cu.front(), ", expected 0");
  for (size_t i = 1; i < cu.size(); ++i)
    RA_CHECK(cu[i] >= cu[i - 1], at, " decreases at entry ", i, " (", cu[i], " after ", cu[i - 1], ")");
  RA_CHECK(cu.back() == p.q_len, at, " ends at ", cu.back(), ", expected q's seq_len ", p.q_len);
  return cu;
}

// (1, rows) int32: the runs' rows of the whole sequence's segment ids.
Tensor segments_of_runs(const std::vector<int32_t>& ids, const std::vector<IndexRun>& runs, MemoryKind memory) {
  Tensor local(DType::kI32, {1, run_rows(runs)}, memory);
  int32_t* out = local.data<int32_t>();
  for (const IndexRun& r : runs)
    for (int64_t i = 0; i < r.count; ++i) *out++ = ids[size_t(r.start + i * r.stride)];
  return local;
}

Tensor read_segments(const H5File& f, const ShardPlan& p, const std::vector<IndexRun>& runs, MemoryKind memory) {
  Selection sel;
  for (const IndexRun& r : runs) sel.push_back({{p.b_offset, r.start}, {p.b_count, r.count}, {1, r.stride}});
  return f.read_int32(p.names.segment_ids, sel, {p.b_count, run_rows(runs)}, memory);
}

}  // namespace

Shape qkv_shape(QkvFormat format, int64_t b, int64_t len, int64_t heads, int64_t x) {
  const int64_t sizes[4] = {b, len, heads, x};
  std::vector<int64_t> shape;
  for (int d : file_dims(format)) shape.push_back(sizes[d]);
  return Shape::of(shape);
}

QkvFormat parse_qkv_format(const std::string& text) {
  for (QkvFormat format : kQkvFormats)
    if (text == qkv_format_name(format)) return format;
  RA_FAIL("--qkv-format '", text, "' is none of bshd (batch, len, heads, dim), bhsd (batch, heads, len, dim: PyTorch's "
          "scaled_dot_product_attention), sbhd (len, batch, heads, dim: Megatron's, TransformerEngine's default), thd "
          "(tokens, heads, dim: FlashAttention's varlen, one batch row)");
}

const char* qkv_format_name(QkvFormat format) {
  switch (format) {
    case QkvFormat::kBHSD: return "bhsd";
    case QkvFormat::kSBHD: return "sbhd";
    case QkvFormat::kTHD: return "thd";
    case QkvFormat::kBSHD: break;
  }
  return "bshd";
}

Tensor reorder_qkv(const TensorView& t, QkvFormat format, bool to_format, MemoryKind memory) {
  const Shape s = t.shape();
  if (format == QkvFormat::kTHD) {  // one batch row: the same elements, without (or with) its dimension
    RA_CHECK(!to_format || s[0] == 1, "thd holds one batch row; this tensor has ", s[0]);
    Tensor out(t.dtype(), to_format ? Shape{s[1], s[2], s[3]} : Shape{1, s[0], s[1], s[2]}, memory);
    std::memcpy(out.view().data(), t.data(), size_t(s.numel()) * dtype_size(t.dtype()));
    return out;
  }
  // bhsd and sbhd each swap two of (batch, len, heads): the same swap goes to the format and back from it.
  const std::vector<int> perm = file_dims(format);
  Tensor out(t.dtype(), {s[perm[0]], s[perm[1]], s[perm[2]], s[3]}, memory);
  const size_t row = size_t(s[3]) * dtype_size(t.dtype());
  const char* from = static_cast<const char*>(t.data());
  char* to = static_cast<char*>(out.view().data());
  int64_t in_index[3];
  for (in_index[0] = 0; in_index[0] < s[0]; ++in_index[0])
    for (in_index[1] = 0; in_index[1] < s[1]; ++in_index[1])
      for (in_index[2] = 0; in_index[2] < s[2]; ++in_index[2]) {
        const int64_t a = in_index[perm[0]], b = in_index[perm[1]], c = in_index[perm[2]];
        const int64_t at = (a * s[perm[1]] + b) * s[perm[2]] + c,
                      from_at = (in_index[0] * s[1] + in_index[1]) * s[2] + in_index[2];
        std::memcpy(to + size_t(at) * row, from + size_t(from_at) * row, row);
      }
  return out;
}

std::string qkv_format_note(const ShardPlan& p, const std::string& path) {
  if (p.names.format != QkvFormat::kBSHD) return "";
  const std::string read_as =
      "note: '" + p.names.q + "' of '" + path + "' read as bshd (batch, q_len, q_heads, head_dim) ";
  switch (likely_misread_format(p.batch, p.q_len, p.q_heads, p.kv_len)) {
    case MisreadFormat::kBHSD:
      return read_as + "has " + std::to_string(p.q_heads) + " heads and " + std::to_string(p.q_len) +
             " tokens: if it holds (batch, heads, len, dim), as PyTorch's scaled_dot_product_attention takes it, "
             "pass --qkv-format bhsd";
    case MisreadFormat::kSBHD:
      return read_as + "has " + std::to_string(p.batch) + " batch rows of one token and one key: if it holds (len, "
             "batch, heads, dim), as Megatron and TransformerEngine do, pass --qkv-format sbhd";
    case MisreadFormat::kNone:
      break;
  }
  return "";
}

AttentionParams on_slice(AttentionParams params, const ShardPlan& plan) {
  params.batch_offset = plan.b_offset;
  params.head_offset = plan.hq_offset;
  return params;
}

Shape pairwise_shape(const Shape& file_shape) {
  Shape shape{1, 1, 1, 1};
  for (int d = 0; d < file_shape.rank; ++d) shape[4 - file_shape.rank + d] = file_shape[d];
  return shape;
}

bool first_holder_of_pairwise(const ShardPlan& p, const Shape& file_shape) {
  const Shape shape = pairwise_shape(file_shape);
  return (shape[0] > 1 || p.b_offset == 0) && (shape[1] > 1 || p.hq_offset == 0) && (shape[2] > 1 || p.sp_index == 0);
}

bool first_holder_of_heads(const ShardPlan& p) { return p.b_offset == 0 && p.sp_index == 0; }

bool first_holder_of_kv_heads(const ShardPlan& p) { return p.hq_offset % (p.q_heads / p.kv_heads) == 0; }

Selection select_pairwise(const ShardPlan& p, const Shape& file_shape) {
  const Shape shape = pairwise_shape(file_shape);
  const bool b1 = shape[0] == 1, h1 = shape[1] == 1;
  const auto file_dims = [&](std::vector<int64_t> four) {  // the leading broadcast dims are not in the file
    four.erase(four.begin(), four.begin() + (4 - file_shape.rank));
    return four;
  };
  Selection sel;
  for (const IndexRun& r : pairwise_runs(p, shape))
    sel.push_back({file_dims({b1 ? 0 : p.b_offset, h1 ? 0 : p.hq_offset, r.start, 0}),
                   file_dims({b1 ? 1 : p.b_count, h1 ? 1 : p.hq_count, r.count, shape[3]}),
                   file_dims({1, 1, r.stride, 1})});
  return sel;
}

Shape pairwise_local_shape(const ShardPlan& p, const Shape& file_shape) {
  const Shape shape = pairwise_shape(file_shape);
  return {shape[0] == 1 ? 1 : p.b_count, shape[1] == 1 ? 1 : p.hq_count, run_rows(pairwise_runs(p, shape)), shape[3]};
}

int64_t ShardPlan::local_q() const { return run_rows(q_runs); }
int64_t ShardPlan::local_kv() const { return run_rows(kv_runs); }

ShardPlan plan_shards(const H5File& f, const MeshShape& mesh, int rank, SequenceLayout layout, const DatasetNames& names) {
  const QkvFormat format = names.format;
  const int B = file_dim(format, 0), L = file_dim(format, 1), H = file_dim(format, 2), X = file_dim(format, 3);
  const int rank_in_file = int(file_dims(format).size());
  const std::string q_dims = dims_text(format, "q_len", "q_heads", "head_dim"),
                    k_dims = dims_text(format, "kv_len", "kv_heads", "head_dim"),
                    v_dims = dims_text(format, "kv_len", "kv_heads", "v_head_dim");
  // A 3-d q where 4 dimensions are expected is likely FlashAttention's varlen layout, and a 4-d one under thd the other.
  DatasetInfo q = required(f, names.q, rank_in_file, q_dims,
                           format == QkvFormat::kTHD
                               ? " (a 4-d one is bshd, bhsd or sbhd: --qkv-format names which)"
                               : " (a 3-d (tokens, heads, dim), as FlashAttention's varlen functions take it, is read "
                                 "with --qkv-format thd)");
  DatasetInfo k = required(f, names.k, rank_in_file, k_dims);
  DatasetInfo v = required(f, names.v, rank_in_file, v_dims);

  for (auto [name, info] : {std::pair{&names.q, &q}, std::pair{&names.k, &k}, std::pair{&names.v, &v}})
    expect_float(f, *name, *info);
  expect_nonempty(f, names.q, q, q_dims.c_str());
  expect_nonempty(f, names.k, k, k_dims.c_str());
  expect_nonempty(f, names.v, v, v_dims.c_str());
  RA_CHECK(k.dtype == q.dtype && v.dtype == q.dtype, "q, k and v of '", f.path(), "' must share a dtype (q is ",
           dtype_name(q.dtype), ", k ", dtype_name(k.dtype), ", v ", dtype_name(v.dtype), ")");
  // Shapes that disagree as this format reads them but agree as another: each error below names that one.
  std::string other_format;
  if (!shapes_agree(format, q.shape, k.shape, v.shape))
    for (QkvFormat other : kQkvFormats)
      if (other_format.empty() && shapes_agree(other, q.shape, k.shape, v.shape))
        other_format = std::string(" (q, k and v agree as ") + qkv_format_name(other) + " " +
                       dims_text(other, "len", "heads", "dim") + ": --qkv-format " + qkv_format_name(other) + "?)";
  if (B >= 0) {
    expect_dim(f, names.k, k, B, "batch", q.shape[B], "(q's batch)", other_format);
    expect_dim(f, names.v, v, B, "batch", q.shape[B], "(q's batch)", other_format);
  }
  expect_dim(f, names.k, k, X, "head_dim", q.shape[X], "(q's head_dim)", other_format);
  expect_dim(f, names.v, v, L, "kv_len", k.shape[L], "(k's kv_len)", other_format);
  expect_dim(f, names.v, v, H, "kv_heads", k.shape[H], "(k's kv_heads)", other_format);
  RA_CHECK(q.shape[H] % k.shape[H] == 0, where(f, names.q), " dimension ", H, " (q_heads) is ", q.shape[H],
           ", expected a multiple of k's kv_heads = ", k.shape[H], other_format);

  ShardPlan p{names,      size_of(format, q.shape, 0), q.shape[L], k.shape[L], q.shape[H], k.shape[H], q.shape[X],
              v.shape[X], q.dtype};
  auto spec_for = [&](const char* axis) { return mesh.has_axis(axis) ? std::vector<std::string>{axis} : std::vector<std::string>{}; };
  NamedSharding sharding(mesh, PartitionSpec{spec_for("dp"), {}, spec_for("tp"), {}});
  // The mesh splits (B, L, H, X) whatever the file's format.
  const Shape q_shape{p.batch, p.q_len, p.q_heads, p.head_dim}, k_shape{p.batch, p.kv_len, p.kv_heads, p.head_dim};
  LocalSlice qs = sharding.local_slice(q_shape, rank, "q");
  p.b_offset = qs.offset[0];
  p.b_count = qs.extent[0];
  p.hq_offset = qs.offset[2];
  p.hq_count = qs.extent[2];
  const int64_t tp = mesh.has_axis("tp") ? mesh.axis_size("tp") : 1;
  RA_CHECK(p.kv_heads % tp == 0 || tp % p.kv_heads == 0, where(f, names.k), " dimension ", H, " (kv_heads) is ", p.kv_heads,
           ": over mesh axis 'tp' of size ", tp, " the kv heads must divide into ", tp,
           " parts, or ", tp, " be a multiple of them (each kv head then held by the tp ranks of its query heads)");
  if (p.kv_heads % tp == 0) {  // kv heads split over tp
    LocalSlice ks = sharding.local_slice(k_shape, rank, "k");
    p.hkv_offset = ks.offset[2];
    p.hkv_count = ks.extent[2];
  } else {  // more tp ranks than kv heads: each kv head held whole by the tp / Hkv ranks of its query heads
    p.hkv_offset = p.hq_offset / (p.q_heads / p.kv_heads);
    p.hkv_count = 1;
    p.kv_head_sharers = int(tp / p.kv_heads);
  }
  if (mesh.has_axis("sp")) {
    p.sp_size = mesh.axis_size("sp");
    p.sp_index = mesh.coords(rank)[size_t(mesh.axis_index("sp"))];
  }
  p.layout = layout;
  p.q_runs = layout_runs(layout, p.q_len, p.sp_size, p.sp_index);
  p.kv_runs = layout_runs(layout, p.kv_len, p.sp_size, p.sp_index);
  if (f.has(names.mask))
    expect_dtype(f, names.mask, check_pairwise(f, names.mask, p), {DType::kU8},
                 "bool or uint8 (non-zero = attend; a float mask that is added to the logits, 0 where seen and -inf "
                 "where hidden as PyTorch's, is a bias: --bias-dataset names it, while .astype(bool) would invert it)");
  if (f.has(names.bias)) expect_dtype(f, names.bias, check_pairwise(f, names.bias, p), {DType::kF32}, "float32");
  if (f.has(names.sinks)) {
    DatasetInfo sinks = required(f, names.sinks, 1, "(q_heads): one logit per query head");
    expect_dtype(f, names.sinks, sinks, {DType::kF32}, "float32");
    expect_dim(f, names.sinks, sinks, 0, "q_heads", p.q_heads, "(q's q_heads)");
  }
  if (f.has(names.segment_ids)) {
    DatasetInfo seg = required(f, names.segment_ids, 2, "(batch, seq_len)");
    RA_CHECK(seg.integer, where(f, names.segment_ids), " holds ", seg.type_name, ", expected integers (any width: "
             "read as int32)");
    RA_CHECK(p.q_len == p.kv_len, where(f, names.segment_ids), " needs q_len == kv_len (", p.q_len, " vs ", p.kv_len, ")");
    expect_dim(f, names.segment_ids, seg, 0, "batch", p.batch, "(q's batch)");
    expect_dim(f, names.segment_ids, seg, 1, "seq_len", p.q_len, "(q's q_len)");
  }
  if (f.has(names.cu_seqlens)) p.cu_seqlens = checked_cu_seqlens(f, names, p);
  return p;
}

std::vector<std::string> unread_datasets(const H5File& f, const DatasetNames& names,
                                         const std::vector<std::string>& also_read) {
  auto relative = [](const std::string& path) { return path.empty() || path[0] != '/' ? path : path.substr(1); };
  const std::string q = relative(names.q);
  const size_t slash = q.find_last_of('/');
  const std::string group = slash == std::string::npos ? "" : q.substr(0, slash + 1);  // "a/b/" or "" (the root)
  auto name_in_group = [&](const std::string& path) {  // "" for a path outside q's group
    const std::string p = relative(path);
    const bool inside = p.compare(0, group.size(), group) == 0 && p.find('/', group.size()) == std::string::npos;
    return inside ? p.substr(group.size()) : std::string();
  };
  std::vector<std::string> read = {"do", kLseGradientDataset, "o", "lse", "dq", "dk", "dv", "dbias", "dsinks"};
  for (const std::string* n : {&names.q, &names.k, &names.v, &names.mask, &names.bias, &names.sinks,
                               &names.segment_ids, &names.cu_seqlens})
    read.push_back(name_in_group(*n));
  for (const std::string& n : also_read) read.push_back(name_in_group(n));
  std::string group_path = "/" + group;  // "/a/b" or "/"
  if (group_path.size() > 1) group_path.pop_back();
  std::vector<std::string> unread;
  for (const std::string& name : f.dataset_names(group_path))
    if (std::find(read.begin(), read.end(), name) == read.end()) unread.push_back(group + name);
  return unread;
}

std::vector<MemoryNeed> local_input_bytes(const ShardPlan& p, const H5File& f, bool whole_kv) {
  const int64_t rows_q = p.local_q(), rows_kv = whole_kv ? p.kv_len : p.local_kv();
  std::vector<MemoryNeed> needs;
  // In doubles: a crafted shape's product may overflow 64 bits.
  auto add = [&](const std::string& name, const Shape& shape, DType dtype) {
    double bytes = double(dtype_size(dtype));
    for (int d = 0; d < shape.rank; ++d) bytes *= double(shape[d]);
    needs.push_back({"'" + name + "' slice " + shape.str() + " " + std::string(dtype_name(dtype)),
                     bytes >= 1.8e19 ? UINT64_MAX : uint64_t(bytes)});
  };
  add(p.names.q, {p.b_count, rows_q, p.hq_count, p.head_dim}, p.dtype);
  add(p.names.k, {p.b_count, rows_kv, p.hkv_count, p.head_dim}, p.dtype);
  add(p.names.v, {p.b_count, rows_kv, p.hkv_count, p.v_head_dim}, p.dtype);
  for (auto [name, dtype] : {std::pair{&p.names.mask, DType::kU8}, std::pair{&p.names.bias, DType::kF32}}) {
    if (!f.has(*name)) continue;
    const Shape s = pairwise_shape(f.info(*name).shape);
    add(*name, {s[0] == 1 ? 1 : p.b_count, s[1] == 1 ? 1 : p.hq_count, s[2] == 1 ? 1 : rows_q, s[3]}, dtype);
  }
  if (f.has(p.names.sinks)) add(p.names.sinks, {p.hq_count}, DType::kF32);
  if (f.has(p.names.segment_ids)) add(p.names.segment_ids, {p.b_count, rows_q + rows_kv}, DType::kI32);
  if (!p.cu_seqlens.empty()) add("segment ids of " + p.names.cu_seqlens, {p.b_count, rows_q + rows_kv}, DType::kI32);
  return needs;
}

AttentionInputs LocalTensors::inputs() const {
  return AttentionInputs{q, k, v, bias, mask, sinks, q_segment_ids, kv_segment_ids};  // undefined stay undefined
}

LocalTensors read_local(const H5File& f, const ShardPlan& p, bool whole_kv, MemoryKind memory) {
  const std::vector<IndexRun> kv_runs = whole_kv ? std::vector<IndexRun>{{0, p.kv_len, 1}} : p.kv_runs;
  LocalTensors t;
  t.q = read_tokens(f, p.names.q, p, p.q_runs, p.hq_offset, p.hq_count, p.head_dim, memory);
  t.k = read_tokens(f, p.names.k, p, kv_runs, p.hkv_offset, p.hkv_count, p.head_dim, memory);
  t.v = read_tokens(f, p.names.v, p, kv_runs, p.hkv_offset, p.hkv_count, p.v_head_dim, memory);
  if (f.has(p.names.mask)) t.mask = read_pairwise(f, p.names.mask, p, memory);  // types checked by plan_shards
  if (f.has(p.names.bias)) t.bias = read_pairwise(f, p.names.bias, p, memory);
  if (f.has(p.names.sinks)) t.sinks = f.read(p.names.sinks, select_heads(p), {p.hq_count}, memory);
  if (f.has(p.names.segment_ids)) {
    t.q_segment_ids = read_segments(f, p, p.q_runs, memory);
    t.kv_segment_ids = read_segments(f, p, kv_runs, memory);
  }
  if (!p.cu_seqlens.empty()) {
    const std::vector<int32_t> ids = segment_ids_from_cu_seqlens(p.cu_seqlens);  // T ints, once
    t.q_segment_ids = segments_of_runs(ids, p.q_runs, memory);
    t.kv_segment_ids = segments_of_runs(ids, kv_runs, memory);
  }
  return t;
}

void write_outputs(const std::string& path, const ShardPlan& p, const TensorView& o, const TensorView& lse,
                   const std::map<std::string, std::string>& attributes, MPI_Comm comm, bool overwrite,
                   const GradientSlices* gradients) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  RA_CHECK(overwrite || !std::filesystem::exists(path), "output '", path,
           "' exists; refusing to replace it (pass --overwrite)");
  const std::string temp = path + ".partial";
  set_partial_output(temp.c_str());  // removed if anything below fails
  {
    H5File f(temp, H5File::Mode::kCreate, comm);
    write_tokens(f, "o", p, p.q_len, p.q_heads, p.q_runs, p.hq_offset, p.hq_count, o);
    f.create_dataset("lse", DType::kF32, {p.batch, p.q_heads, p.q_len});
    f.write("lse", select_lse(p), lse);
    if (gradients != nullptr) {
      write_tokens(f, "dq", p, p.q_len, p.q_heads, p.q_runs, p.hq_offset, p.hq_count, gradients->dq);
      write_tokens(f, "dk", p, p.kv_len, p.kv_heads, p.kv_runs, p.hkv_offset, p.hkv_count, gradients->dk);
      write_tokens(f, "dv", p, p.kv_len, p.kv_heads, p.kv_runs, p.hkv_offset, p.hkv_count, gradients->dv);
      if (gradients->dbias.defined()) {  // the bias's shape; ranks sharing a broadcast part write the same sums
        f.create_dataset("dbias", DType::kF32, gradients->bias_shape);
        f.write("dbias", select_pairwise(p, gradients->bias_shape), gradients->dbias);
      }
      if (gradients->dsinks.defined()) {  // ranks of the same heads write the same sums
        f.create_dataset("dsinks", DType::kF32, {p.q_heads});
        f.write("dsinks", select_heads(p), gradients->dsinks);
      }
    }
    for (const auto& [name, value] : attributes) f.set_attribute(name, value);
    f.set_attribute("manifest", manifest_json(p, o.dtype(), output_checksums(p, o, lse, comm), attributes));
    f.close();
  }
  MPI_Barrier(comm);
  if (rank == 0) std::filesystem::rename(temp, path);
  clear_partial_output();
  MPI_Barrier(comm);
}

void read_outputs(const H5File& f, const ShardPlan& p, Tensor& o, Tensor& lse, bool lse_optional) {
  const QkvFormat format = p.names.format;
  expect_token_output(f, format, "o", {p.batch, p.q_len, p.q_heads, p.v_head_dim},
                      dims_text(format, "q_len", "q_heads", "v_head_dim"));
  const bool with_lse = !lse_optional || f.has("lse");
  if (with_lse) {
    DatasetInfo li = required(f, "lse", 3, "(batch, q_heads, q_len)");
    expect_dtype(f, "lse", li, {DType::kF32}, "float32 (natural log)");
    RA_CHECK(li.shape == (Shape{p.batch, p.q_heads, p.q_len}), where(f, "lse"), " has shape ", li.shape.str(),
             ", expected (", p.batch, ", ", p.q_heads, ", ", p.q_len, ")");
  }
  o = read_tokens(f, "o", p, p.q_runs, p.hq_offset, p.hq_count, p.v_head_dim);
  if (with_lse) lse = f.read("lse", select_lse(p), {p.b_count, p.hq_count, p.local_q()});
}

void check_upstream_gradient(const H5File& f, const ShardPlan& p, const std::string& name) {
  const QkvFormat format = p.names.format;
  const std::string dims = dims_text(format, "q_len", "q_heads", "v_head_dim");
  const Shape expected = qkv_shape(format, p.batch, p.q_len, p.q_heads, p.v_head_dim);
  RA_CHECK(f.has(name), "--backward needs dO: '", f.path(), "' has no dataset '", name, "' of shape ", expected.str(),
           " ", dims, " (write one with generate --with-grad, or name it with --do-dataset)",
           what_the_file_holds(f, name));
  const DatasetInfo info = required(f, name, expected.rank, dims);
  const std::string hint = format_hint(format, info.shape, {p.batch, p.q_len, p.q_heads, p.v_head_dim});
  RA_CHECK(hint.empty(), where(f, name), " has shape ", info.shape.str(), ", expected ", expected.str(), " ", dims, hint);
  const char* names[4] = {"batch", "q_len", "q_heads", "v_head_dim"};
  const char* because[4] = {"(q's batch)", "(q's q_len)", "(q's q_heads)", "(v's v_head_dim)"};
  const std::vector<int> in_file = file_dims(format);
  for (int d = 0; d < expected.rank; ++d)
    expect_dim(f, name, info, d, names[in_file[size_t(d)]], expected[d], because[in_file[size_t(d)]]);
  expect_dtype(f, name, info, {p.dtype, DType::kF32}, "q's dtype or float32");
}

Tensor read_upstream_gradient(const H5File& f, const ShardPlan& p, const std::string& name, MemoryKind memory) {
  return read_tokens(f, name, p, p.q_runs, p.hq_offset, p.hq_count, p.v_head_dim, memory);
}

bool check_lse_gradient(const H5File& f, const ShardPlan& p, const std::string& name) {
  if (!f.has(name)) {
    RA_CHECK(name == kLseGradientDataset, "--dlse-dataset: '", f.path(), "' has no dataset '", name, "' (dLoss/dlse, ",
             "float32 (", p.batch, ", ", p.q_heads, ", ", p.q_len, "))", what_the_file_holds(f, name));
    return false;
  }
  const DatasetInfo info = required(f, name, 3, "(batch, q_heads, q_len)");
  expect_dim(f, name, info, 0, "batch", p.batch, "(q's batch)");
  expect_dim(f, name, info, 1, "q_heads", p.q_heads, "(q's q_heads)");
  expect_dim(f, name, info, 2, "q_len", p.q_len, "(q's q_len)");
  expect_dtype(f, name, info, {DType::kF32}, "float32 (dLoss/dlse, as lse)");
  return true;
}

Tensor read_lse_gradient(const H5File& f, const ShardPlan& p, const std::string& name, MemoryKind memory) {
  return f.read(name, select_lse(p), {p.b_count, p.hq_count, p.local_q()}, memory);
}

void read_gradients(const H5File& f, const ShardPlan& p, Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dbias,
                    Tensor& dsinks) {
  const QkvFormat format = p.names.format;
  const std::pair<const char*, Shape> expected[] = {{"dq", {p.batch, p.q_len, p.q_heads, p.head_dim}},
                                                    {"dk", {p.batch, p.kv_len, p.kv_heads, p.head_dim}},
                                                    {"dv", {p.batch, p.kv_len, p.kv_heads, p.v_head_dim}}};
  for (const auto& [name, e] : expected)
    expect_token_output(f, format, name, e, dims_text(format, "len", "heads", "dim"));
  dq = read_tokens(f, "dq", p, p.q_runs, p.hq_offset, p.hq_count, p.head_dim);
  dk = read_tokens(f, "dk", p, p.kv_runs, p.hkv_offset, p.hkv_count, p.head_dim);
  dv = read_tokens(f, "dv", p, p.kv_runs, p.hkv_offset, p.hkv_count, p.v_head_dim);
  if (f.has("dbias")) {
    const DatasetInfo info = check_pairwise(f, "dbias", p);
    expect_dtype(f, "dbias", info, {DType::kF32}, "float32");
    dbias = f.read("dbias", select_pairwise(p, info.shape), pairwise_local_shape(p, info.shape));
  }
  if (f.has("dsinks")) {
    const DatasetInfo info = required(f, "dsinks", 1, "(q_heads)");
    RA_CHECK((info.shape == Shape{p.q_heads}), where(f, "dsinks"), " has shape ", info.shape.str(), ", expected (",
             p.q_heads, ")");
    expect_dtype(f, "dsinks", info, {DType::kF32}, "float32");
    dsinks = f.read("dsinks", select_heads(p), {p.hq_count});
  }
}

}  // namespace ra::cli
