// `ringattn generate`: random Q/K/V (and optionally mask, bias, sinks, segment ids) in an HDF5 file,
// written by rank 0 through a temporary name.
#include <filesystem>
#include <random>

#include "launch/commands.h"
#include "launch/output_path.h"
#include "launch/sharded_io.h"
#include "runtime/activity.h"
#include "runtime/error.h"
#include "launch/hdf5_file.h"
#include "runtime/random.h"

namespace ra::cli {
namespace {

void write(H5File& f, const char* name, const Tensor& t) {
  f.create_dataset(name, t.dtype(), t.shape());
  f.write(name, whole(t.shape()), t);
}

// q, k, v, do: drawn as (B, L, H, X), so that one seed gives the same values in every format.
void write_tokens(H5File& f, const char* name, const Tensor& t, QkvFormat format) {
  if (format == QkvFormat::kBSHD) return write(f, name, t);
  write(f, name, reorder_qkv(t.view(), format, /*to_format=*/true));
}

}  // namespace

int cmd_generate(int argc, char** argv, const MpiSession& mpi) {
  std::string output, dtype_text = "f32";
  int64_t batch = 1, seq = 0, kv_seq = 0, heads = 0, kv_heads = 0, head_dim = 0, v_head_dim = 0, segments = 0;
  uint64_t seed = 0;
  bool with_mask = false, with_bias = false, with_sinks = false, with_grad = false, with_lse_grad = false,
       overwrite = false, cu_seqlens = false;
  std::string qkv_format = "bshd";
  po::options_description desc("ringattn generate");
  desc.add_options()("help", "this text")
    ("output", po::value(&output)->required(), "HDF5 file to write")
    ("batch", po::value(&batch)->default_value(1), "B")
    ("seq", po::value(&seq)->required(), "T: query length")
    ("kv-seq", po::value(&kv_seq), "S: key length (default T)")
    ("heads", po::value(&heads)->required(), "Hq: query heads")
    ("kv-heads", po::value(&kv_heads), "Hkv: key/value heads (default Hq)")
    ("head-dim", po::value(&head_dim)->required(), "D")
    ("v-head-dim", po::value(&v_head_dim), "Dv (default D)")
    ("dtype", po::value(&dtype_text)->default_value("f32"), "f32 | f16 | bf16")
    ("seed", po::value(&seed)->default_value(0), "random seed")
    ("with-mask", po::bool_switch(&with_mask), "add a random boolean mask (1, 1, T, S)")
    ("with-bias", po::bool_switch(&with_bias), "add a random f32 bias (1, Hq, T, S)")
    ("with-sinks", po::bool_switch(&with_sinks), "add random f32 attention sinks (Hq)")
    ("with-grad", po::bool_switch(&with_grad), "add a random upstream gradient do (B, T, Hq, Dv) for run --backward")
    ("with-lse-grad", po::bool_switch(&with_lse_grad), "add a random f32 dlse (B, Hq, T), the gradient of a loss that "
     "reads lse too, for run --backward")
    ("segments", po::value(&segments)->default_value(0), "pack N sequences: segment_ids (B, T) (needs S == T)")
    ("cu-seqlens", po::bool_switch(&cu_seqlens), "with --segments and --batch 1: write the packing as FlashAttention's "
     "cumulative lengths cu_seqlens (N + 1) int32 instead of segment_ids")
    ("qkv-format", po::value(&qkv_format)->default_value(qkv_format), "bshd | bhsd | sbhd | thd: how q, k, v and do "
     "hold their dimensions (run's --qkv-format); the same values in each (thd: --batch 1)")
    ("overwrite", po::bool_switch(&overwrite), "replace an existing file");
  if (!parse(argc, argv, desc, "Usage: ringattn generate --output F --seq T --heads H --head-dim D [options]")) return kOk;
  const DType dtype = parse_dtype(dtype_text);
  const QkvFormat format = parse_qkv_format(qkv_format);
  if (kv_seq == 0) kv_seq = seq;
  if (kv_heads == 0) kv_heads = heads;
  if (v_head_dim == 0) v_head_dim = head_dim;
  for (auto [v, name] : {std::pair{batch, "batch"}, {seq, "seq"}, {kv_seq, "kv-seq"}, {heads, "heads"},
                         {kv_heads, "kv-heads"}, {head_dim, "head-dim"}, {v_head_dim, "v-head-dim"}})
    positive(v, name);
  RA_CHECK(heads % kv_heads == 0, "--heads ", heads, " is not a multiple of --kv-heads ", kv_heads);
  RA_CHECK(format != QkvFormat::kTHD || batch == 1, "--qkv-format thd holds one batch row (--batch is ", batch, ")");
  RA_CHECK(segments >= 0 && segments <= seq, "--segments ", segments, " must be between 0 and --seq ", seq,
           " (each document holds at least one token)");
  RA_CHECK(segments == 0 || seq == kv_seq, "--segments needs --kv-seq equal to --seq");
  RA_CHECK(!cu_seqlens || (segments > 0 && batch == 1), "--cu-seqlens writes the packing of --segments N (given: ",
           segments, ") for a batch of one row (--batch is ", batch, ")");
  check_output_path(output, "", overwrite);
  if (mpi.world_rank() == 0) {
    std::mt19937_64 rng(seed);
    const std::string temp = output + ".partial";
    set_partial_output(temp.c_str());  // removed if writing fails
    {
      H5File f(temp, H5File::Mode::kCreate);
      write_tokens(f, "q", random_normal(dtype, {batch, seq, heads, head_dim}, rng), format);
      write_tokens(f, "k", random_normal(dtype, {batch, kv_seq, kv_heads, head_dim}, rng), format);
      write_tokens(f, "v", random_normal(dtype, {batch, kv_seq, kv_heads, v_head_dim}, rng), format);
      if (with_mask) {
        Tensor m(DType::kU8, {1, 1, seq, kv_seq});
        for (int64_t i = 0; i < m.numel(); ++i) m.data<uint8_t>()[i] = (rng() % 8) != 0;
        write(f, "mask", m);
      }
      if (with_bias) write(f, "bias", random_normal(DType::kF32, {1, heads, seq, kv_seq}, rng));
      if (with_grad) write_tokens(f, "do", random_normal(dtype, {batch, seq, heads, v_head_dim}, rng), format);
      if (segments > 0) {
        Tensor s(DType::kI32, {batch, seq});
        for (int64_t i = 0; i < s.numel(); ++i) s.data<int32_t>()[i] = int32_t((i % seq) * segments / seq);
        if (!cu_seqlens) {
          write(f, "segment_ids", s);
        } else {  // the same documents: document d's first token is the first whose id is d
          Tensor cu(DType::kI32, {segments + 1});
          for (int64_t d = 0, t = 0; d <= segments; ++d) {
            while (t < seq && s.data<int32_t>()[t] < d) ++t;
            cu.data<int32_t>()[d] = int32_t(d == segments ? seq : t);
          }
          write(f, "cu_seqlens", cu);
        }
      }
      if (with_sinks) write(f, "sinks", random_normal(DType::kF32, {heads}, rng));  // late: earlier draws unchanged
      if (with_lse_grad) write(f, "dlse", random_normal(DType::kF32, {batch, heads, seq}, rng));
      f.set_attribute("generator", std::string("ringattn generate seed=") + std::to_string(seed));
      f.close();
    }
    std::filesystem::rename(temp, output);
    clear_partial_output();
    std::string extras;  // the optional datasets written, so that none is assumed
    if (with_mask) extras += ", mask";
    if (with_bias) extras += ", bias";
    if (with_grad) extras += ", do";
    if (with_lse_grad) extras += ", dlse";
    if (segments > 0)
      extras += std::string(cu_seqlens ? ", cu_seqlens (" : ", segment_ids (") + std::to_string(segments) + " documents)";
    if (with_sinks) extras += ", sinks";
    std::printf("wrote %s: q %s k %s v %s (%s) %s%s\n", output.c_str(),
                qkv_shape(format, batch, seq, heads, head_dim).str().c_str(),
                qkv_shape(format, batch, kv_seq, kv_heads, head_dim).str().c_str(),
                qkv_shape(format, batch, kv_seq, kv_heads, v_head_dim).str().c_str(), qkv_format.c_str(),
                dtype_text.c_str(), extras.c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return kOk;
}

}  // namespace ra::cli
