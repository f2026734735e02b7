// Sharded HDF5 I/O for the CLI: which slice of q, k, v (and mask, bias, sinks, segment_ids or cu_seqlens) this rank holds
// under the mesh (batch over dp, heads over tp, sequence over sp by the layout), reading exactly
// that slice, and writing o / lse slices into a file that appears under its name only when complete.
#pragma once

#include <mpi.h>

#include <map>
#include <string>
#include <vector>

#include "attention/inputs.h"
#include "attention/params.h"
#include "launch/memory_budget.h"
#include "mesh/mesh_shape.h"
#include "mesh/sequence_layout.h"
#include "launch/hdf5_file.h"

namespace ra::cli {

// How the files hold q, k, v, do and the outputs o, dq, dk, dv, by TransformerEngine's names: bshd, (batch, len,
// heads, dim) as ringattn and FlashAttention keep them; bhsd, PyTorch's scaled_dot_product_attention's; sbhd,
// Megatron's and TransformerEngine's default (len first); thd, FlashAttention's varlen (tokens, heads, dim), one batch
// row without its dimension (cu_seqlens packs the sequences). Masks, biases and lse are (batch, heads, ...) in all.
enum class QkvFormat { kBSHD, kBHSD, kSBHD, kTHD };
inline constexpr QkvFormat kQkvFormats[] = {QkvFormat::kBSHD, QkvFormat::kBHSD, QkvFormat::kSBHD, QkvFormat::kTHD};
// bshd and thd hold a (B, L, H, X) tensor's elements in memory's order: read and written without a reorder.
constexpr bool in_memory_order(QkvFormat format) { return format == QkvFormat::kBSHD || format == QkvFormat::kTHD; }
QkvFormat parse_qkv_format(const std::string& text);  // refuses any other name, naming --qkv-format
const char* qkv_format_name(QkvFormat format);       // "bshd", ...
// A (B, L, H, X) tensor's shape in `format`.
Shape qkv_shape(QkvFormat format, int64_t b, int64_t len, int64_t heads, int64_t x);
// A (B, L, H, X) host tensor in `format`'s order (thd: B must be 1, the shape (L, H, X)), or back from it to
// (B, L, H, X) (`to_format` false; `t` then in the format's order).
Tensor reorder_qkv(const TensorView& t, QkvFormat format, bool to_format, MemoryKind memory = MemoryKind::kHost);

// Where the datasets sit in the input file (paths through groups allowed, e.g. /layer3/attn/q), and how
// they hold their tensors (the outputs take the same format).
struct DatasetNames {
  std::string q = "q", k = "k", v = "v", mask = "mask", bias = "bias", sinks = "sinks", segment_ids = "segment_ids";
  // FlashAttention's cumulative sequence lengths [0, l0, l0 + l1, ..., T] of the sequences packed into a
  // batch of one row: the segment ids they imply (one of the two may be given).
  std::string cu_seqlens = "cu_seqlens";
  QkvFormat format = QkvFormat::kBSHD;
};

struct ShardPlan {
  DatasetNames names;
  int64_t batch, q_len, kv_len, q_heads, kv_heads, head_dim, v_head_dim;
  DType dtype;
  int64_t b_offset, b_count, hq_offset, hq_count, hkv_offset, hkv_count;
  // Where the tp axis has more ranks than kv heads (a multiple of them), each kv head is held whole by the
  // tp / Hkv ranks of its query heads (as Megatron replicates them): their dK / dV parts sum to its gradient.
  int kv_head_sharers = 1;
  int sp_size = 1, sp_index = 0;
  SequenceLayout layout = SequenceLayout::kContiguous;
  std::vector<IndexRun> q_runs, kv_runs;  // this rank's rows along T and S
  std::vector<int64_t> cu_seqlens;  // the input's, checked (empty where it gives none)
  int64_t local_q() const;
  int64_t local_kv() const;
};

// Reads the shapes and types of every dataset, checks them (naming file, dataset, dimension, what was
// found and what is expected) and plans this rank's slice. Every rank computes the same checks, so a
// bad file fails everywhere before any exchange. Any length splits over any number of ranks (shards
// differ by a row; a rank may hold none).
ShardPlan plan_shards(const H5File& file, const MeshShape& mesh, int rank, SequenceLayout layout,
                      const DatasetNames& names = {});

// A note where q's shape looks like another format read as bshd: more "heads" than any model has and than "tokens"
// (bhsd), or one token of one key in each of many "batch rows" (sbhd); empty where it does not, or for other formats.
std::string qkv_format_note(const ShardPlan& plan, const std::string& path);

// The datasets beside q (in q's group) that a run reads none of: not named by `names` or `also_read`, nor
// ringattn's own (do, dlse, and the outputs o, lse, dq, dk, dv, dbias, dsinks). A user's mask or packed
// sequences under another name (attention_mask, cu_seqlens_q) would otherwise be ignored without a word.
std::vector<std::string> unread_datasets(const H5File& file, const DatasetNames& names,
                                         const std::vector<std::string>& also_read);

// What this rank's slices take once read (with the whole of K/V when `whole_kv`), per dataset, named
// with the slice's shape and dtype.
std::vector<MemoryNeed> local_input_bytes(const ShardPlan& plan, const H5File& file, bool whole_kv = false);

struct LocalTensors {
  Tensor q, k, v, mask, bias, sinks, q_segment_ids, kv_segment_ids;  // sinks: this rank's heads
  AttentionInputs inputs() const;
};
// Reads this rank's slices into `memory` (kPinned when they go on to a GPU); `whole_kv` reads all S
// rows of k / v instead (the verifier's reference).
LocalTensors read_local(const H5File& file, const ShardPlan& plan, bool whole_kv = false,
                        MemoryKind memory = MemoryKind::kHost);

// The backward's gradients of this rank's slices: dq (B, T, Hq, D), dk (B, S, Hkv, D), dv (B, S, Hkv, Dv),
// dbias in the bias's shape and dsinks (this rank's heads of (Hq)), each summed over the ranks that share it.
struct GradientSlices {
  TensorView dq, dk, dv, dbias;
  Shape bias_shape;  // the input bias's, as in the file (rank 1-4): dbias takes it, each rank writing its part
  TensorView dsinks;
};

// The call's params on this rank's slice of batch and heads: dropout keyed by their global indices, so
// that every mesh drops what one rank would.
AttentionParams on_slice(AttentionParams params, const ShardPlan& plan);

// A mask, bias or dbias dataset's shape as (B|1, H|1, T|1, S|1): numpy's broadcast, missing leading
// dimensions taken as 1 (a (T, S) mask holds every batch and head).
Shape pairwise_shape(const Shape& file_shape);
// Whether this rank is the first of those holding the same part of a mask / bias (its broadcast dimensions
// over the ranks that split them) or of the sinks (every batch and sequence rank of its heads): the one that
// counts it, so that counts summed over the ranks are the file's.
bool first_holder_of_pairwise(const ShardPlan& plan, const Shape& file_shape);
bool first_holder_of_heads(const ShardPlan& plan);
// Whether this rank is the first of the tp ranks holding its kv heads (ShardPlan::kv_head_sharers).
bool first_holder_of_kv_heads(const ShardPlan& plan);
// This rank's part of such a dataset (a selection in the file's own rank), and its local (rank 4) shape.
Selection select_pairwise(const ShardPlan& p, const Shape& file_shape);
Shape pairwise_local_shape(const ShardPlan& p, const Shape& file_shape);

// Writes o (B, T, Hq, Dv) and lse (B, Hq, T) slices (and the gradients, when given; the token-major ones in the plan's
// QkvFormat, from slices in memory's (B, T, H, X)) collectively to
// `path` through a temporary name, renamed by rank 0 after every rank has closed the file. Refuses an
// existing file unless overwrite.
void write_outputs(const std::string& path, const ShardPlan& plan, const TensorView& o, const TensorView& lse,
                   const std::map<std::string, std::string>& attributes, MPI_Comm comm, bool overwrite,
                   const GradientSlices* gradients = nullptr);

// Reads this rank's slices of o and lse from an output file; lse may be absent where lse_optional (an output
// not written by run).
void read_outputs(const H5File& file, const ShardPlan& plan, Tensor& o, Tensor& lse, bool lse_optional = false);

// dO (B, T, Hq, Dv) (in the plan's QkvFormat), the backward's input: checked (shape, dtype q's or f32, naming file, dataset and
// dimension) and read as this rank's slice of the query rows.
void check_upstream_gradient(const H5File& file, const ShardPlan& plan, const std::string& name);
Tensor read_upstream_gradient(const H5File& file, const ShardPlan& plan, const std::string& name,
                              MemoryKind memory = MemoryKind::kHost);

// dLoss/dLSE (B, Hq, T) float32, where the loss reads lse too: true when the file has `name` (checked as dO
// is), false when it has none (refused when the name is not the default's: the user named it).
bool check_lse_gradient(const H5File& file, const ShardPlan& plan, const std::string& name);
Tensor read_lse_gradient(const H5File& file, const ShardPlan& plan, const std::string& name,
                         MemoryKind memory = MemoryKind::kHost);
inline constexpr const char* kLseGradientDataset = "dlse";

// Reads this rank's slices of dq, dk, dv (and of dbias and dsinks, when the file has them) from an output file.
void read_gradients(const H5File& file, const ShardPlan& plan, Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dbias,
                    Tensor& dsinks);

}  // namespace ra::cli
