// `ringattn verify`: recompute each rank's rows with the f64 reference against the whole K/V, compare
// with the output file, count wrong elements over all ranks (nccl-tests style) and fail on any.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "attention/cpu/sdpa_cpu.h"
#include "attention/tolerance.h"
#include "attention/compare.h"
#include "attention/registry.h"
#include "launch/commands.h"
#include "launch/option_scope.h"
#include "launch/output_manifest.h"
#include "launch/sharded_io.h"
#include "runtime/error.h"

namespace ra::cli {
namespace {

// The gradients of `run --backward` against the f64 oracle's; returns the wrong elements of all ranks.
int64_t verify_gradients(const H5File& in_file, const H5File& out_file, const ShardPlan& plan, const LocalTensors& local,
                         const TokenPositions& pos, const AttentionParams& params, const std::string& do_dataset,
                         const std::string& dlse_dataset, double logit_rounding, bool foreign, Job& job) {
  check_upstream_gradient(in_file, plan, do_dataset);
  const Tensor d_o = read_upstream_gradient(in_file, plan, do_dataset);
  const Tensor d_lse =
      check_lse_gradient(in_file, plan, dlse_dataset) ? read_lse_gradient(in_file, plan, dlse_dataset) : Tensor();
  Tensor dq, dk, dv, dbias, dsinks;
  read_gradients(out_file, plan, dq, dk, dv, dbias, dsinks);
  ReferenceGradients ref = reference_attention_backward_f64(local.inputs(), params, pos, d_o, true, d_lse);
  if (plan.sp_size > 1) {  // this rank's queries gave every key a part of dK / dV: sum them, keep its rows
    Communicator& sequence = job.sequence_axis();
    const std::vector<int64_t> rows = layout_indices(plan.layout, plan.kv_len, plan.sp_size, plan.sp_index);
    for (auto [full, width] : {std::pair{&ref.dk, plan.head_dim}, std::pair{&ref.dv, plan.v_head_dim},
                               std::pair{&ref.dk_terms, plan.head_dim}, std::pair{&ref.dv_terms, plan.v_head_dim}}) {
      sequence.all_reduce(full->data(), full->size(), ReduceOp::kSum);
      const int64_t row_width = plan.hkv_count * width, batch = int64_t(full->size()) / (plan.kv_len * row_width);
      std::vector<double> mine;
      mine.reserve(size_t(batch) * rows.size() * size_t(row_width));
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t r : rows)
          mine.insert(mine.end(), full->begin() + (b * plan.kv_len + r) * row_width,
                      full->begin() + (b * plan.kv_len + r + 1) * row_width);
      *full = std::move(mine);
    }
  }
  // A kv head held by several tp ranks: its gradient sums their query heads' parts.
  for (std::vector<double>* part : {&ref.dk, &ref.dv, &ref.dk_terms, &ref.dv_terms}) sum_shared_kv_heads(*part, plan, job);
  // The GPU kernels round P and dS to the input dtype before their products; the CPU ones keep f32. Another
  // library's outputs (`foreign`: no manifest) are allowed the GPU kernels' rounding.
  const bool on_gpu = out_file.string_attribute("backend") == "cuda" || foreign;
  const DType rounded = on_gpu ? plan.dtype : DType::kF32;
  // run --grad-wire bf16: each hop rounded the dK / dV partial sums to bf16, at most once a rank (as asked).
  const bool bf16_wire = out_file.string_attribute("grad_wire") == dtype_name(DType::kBF16);
  const std::string ranks = out_file.string_attribute("sequence_ranks");
  const double wire_rounding = bf16_wire && !ranks.empty() ? std::stod(ranks) * dtype_unit_roundoff(DType::kBF16) : 0.0;
  if (bf16_wire && job.world.rank() == 0)
    std::printf("ringattn verify: dk and dv went over a bf16 wire (run --grad-wire bf16): %.3g of their terms allowed\n",
                wire_rounding);
  struct Result {
    const char* name;
    GradientComparison c;
    bool given = true;  // dbias and dsinks only where the input has a bias / sinks
  };
  Result results[5] = {{"dq", compare_gradient(dq, ref.dq, rounded, &ref.dq_terms, logit_rounding)},
                       {"dk", compare_gradient(dk, ref.dk, rounded, &ref.dk_terms, logit_rounding, wire_rounding)},
                       {"dv", compare_gradient(dv, ref.dv, rounded, &ref.dv_terms, logit_rounding, wire_rounding)},
                       {"dbias", {}, dbias.defined()},
                       {"dsinks", {}, local.sinks.defined()}};
  if (!first_holder_of_kv_heads(plan))  // the other tp ranks of these kv heads hold the same dk, dv: count once
    for (Result* r : {&results[1], &results[2]}) r->c.wrong = r->c.nan = 0;
  if (dbias.defined()) {  // the file holds the sums over the ranks that share a broadcast part of the bias
    const Shape bias_shape = in_file.info(plan.names.bias).shape;
    for (std::vector<double>* sums : {&ref.dbias, &ref.dbias_terms})
      sum_shared_bias_gradient(*sums, bias_shape, job, {"dp", "tp", "sp"});
    results[3].c = compare_gradient(dbias, ref.dbias, rounded, &ref.dbias_terms, logit_rounding);
    if (!first_holder_of_pairwise(plan, bias_shape))  // its other holders' elements: count once
      results[3].c.wrong = results[3].c.nan = 0;
  }
  if (results[4].given) {  // over every query row: this rank's part of the sum, summed over the batch and sequence ranks
    RA_CHECK(dsinks.defined(), "output '", out_file.path(), "' has no dataset 'dsinks': the input has sinks (was it "
             "written by run --backward with them?)");
    for (std::vector<double>* sums : {&ref.dsinks, &ref.dsinks_terms}) sum_over_mesh_axes(*sums, job, {"dp", "sp"});
    results[4].c = compare_gradient(dsinks, ref.dsinks, rounded, &ref.dsinks_terms, logit_rounding);
    if (!first_holder_of_heads(plan))  // the dp and sp ranks of these heads hold the same values: count once
      results[4].c.wrong = results[4].c.nan = 0;
  }
  int64_t wrong = 0;
  for (const auto& [name, c, given] : results) {
    double error = c.max_abs_error, tolerance = c.tolerance;
    int64_t bad = c.wrong + c.nan;
    job.world.all_reduce(&error, 1, ReduceOp::kMax);
    job.world.all_reduce(&tolerance, 1, ReduceOp::kMax);
    job.world.all_reduce(&bad, 1, ReduceOp::kSum);
    wrong += bad;
    if (job.world.rank() == 0 && given)
      std::printf("ringattn verify: %s vs f64 reference: max |err| %.3e (tolerance %.3e), #wrong %ld  %s\n", name,
                  error, tolerance, long(bad), bad ? "FAILED" : "OK");
  }
  return wrong;
}

// logit_rounding's rows over every rank: the largest of the rows f32 resolves, and those it cannot (their count, their
// largest rounding and a logit of theirs).
struct LogitRoundingSummary {
  double resolved = 0, unresolved = 0, unresolved_logit = 0;
  int64_t unresolved_rows = 0;
};
LogitRoundingSummary summarise(const std::vector<double>& row_rounding, const std::vector<double>& reference_lse,
                               Job& job) {
  LogitRoundingSummary s;
  for (size_t i = 0; i < row_rounding.size(); ++i) {
    if (row_rounding[i] < kUnresolvedLogitRounding) {
      s.resolved = std::max(s.resolved, row_rounding[i]);
      continue;
    }
    ++s.unresolved_rows;
    s.unresolved = std::max(s.unresolved, row_rounding[i]);
    s.unresolved_logit = std::max(s.unresolved_logit, std::fabs(reference_lse[i]));
  }
  double largest[3] = {s.resolved, s.unresolved, s.unresolved_logit};
  job.world.all_reduce(largest, 3, ReduceOp::kMax);
  job.world.all_reduce(&s.unresolved_rows, 1, ReduceOp::kSum);
  s.resolved = largest[0], s.unresolved = largest[1], s.unresolved_logit = largest[2];
  return s;
}

}  // namespace

int cmd_verify(int argc, char** argv, const MpiSession& mpi) {
  AttentionOptions opts;
  DatasetOptions datasets;
  std::string input, output, do_dataset = "do", dlse_dataset = kLseGradientDataset;
  po::options_description desc("ringattn verify");
  desc.add_options()("help", "this text")
    ("input", po::value(&input)->required(), "the input HDF5 file")
    ("output", po::value(&output)->required(), "the output HDF5 file of ringattn run")
    ("do-dataset", po::value(&do_dataset)->default_value(do_dataset), "path of dO in the input (outputs of run --backward)")
    ("dlse-dataset", po::value(&dlse_dataset)->default_value(dlse_dataset), "path of the optional dLoss/dlse in the input "
     "(outputs of run --backward; read where present)");
  add_dataset_options(desc, datasets);
  add_attention_options(desc, opts, AttentionRegistry::builtin().list_implementations());
  if (!parse(argc, argv, desc, "Usage: mpirun -np N ringattn verify --input F --output G [same attention options]",
             &datasets, &opts.given))
    return kOk;
  check_options_apply(opts);  // before the files open, on every rank
  Job job(opts, mpi, args_text(argc, argv));
  const int rank = job.world.rank();
  H5File in_file(input, H5File::Mode::kRead, job.world.comm());
  H5File out_file(output, H5File::Mode::kRead, job.world.comm());
  check_named_datasets(datasets, in_file);
  ShardPlan plan = plan_shards(in_file, job.shape, rank, chosen_layout(opts), datasets.names);
  const AttentionParams params = on_slice(to_params(opts), plan);
  check_host_memory(local_input_bytes(plan, in_file, /*whole_kv=*/true), input, job.world.comm());
  // Other options than run's would fail every element, as if the kernels were wrong: say so instead.
  const std::string recorded = out_file.string_attribute("attention");
  const std::string asked = attention_semantics(params, plan.head_dim);
  RA_CHECK(recorded.empty() || recorded == asked, "output '", output, "' was written by run with the options ", recorded,
           " but verify was given ", asked, ": give verify the attention options run had");
  // run's outputs take its input's format: verify given another would read o's rows as heads.
  const std::string recorded_format = out_file.string_attribute("qkv_format");
  const char* asked_format = qkv_format_name(plan.names.format);
  RA_CHECK(recorded_format.empty() || recorded_format == asked_format, "output '", output, "' was written by run from ",
           "--qkv-format ", recorded_format, " files but verify reads ", asked_format, ": give verify the --qkv-format "
           "run had");
  const std::string format_note = qkv_format_note(plan, input);
  if (rank == 0 && !format_note.empty()) std::fprintf(stderr, "ringattn verify: %s\n", format_note.c_str());
  LocalTensors local = read_local(in_file, plan, /*whole_kv=*/true);
  // A file without run's manifest (another library's outputs written with h5py) is checked by its values alone,
  // against the options given here; its lse, if it has none, is left out.
  const std::string manifest = out_file.string_attribute("manifest");
  const bool foreign = manifest.empty();
  Tensor o, lse;
  read_outputs(out_file, plan, o, lse, /*lse_optional=*/foreign);
  if (foreign) {
    if (rank == 0)
      std::printf("ringattn verify: '%s' has no manifest (not written by ringattn run): its values are checked against "
                  "the attention options given here%s, without checksums\n",
                  output.c_str(), lse.defined() ? "" : " (it has no lse: o only)");
  } else {  // the file is what `run` wrote: its manifest's checksums match before any number is compared
    check_manifest(manifest, output_checksums(plan, o, lse, job.world.comm()), output);
  }

  // This rank's queries against every key.
  TokenPositions pos = TokenPositions::dense(plan.q_len, plan.kv_len);
  pos.q = layout_query_positions(plan.layout, plan.q_len, plan.kv_len, plan.sp_size, plan.sp_index);
  ReferenceOutput ref = reference_attention_f64(local.inputs(), params, pos);

  double max_v = 0;
  for (int64_t i = 0; i < local.v.numel(); ++i)
    max_v = std::max(max_v, double(std::fabs(load_as_f32(local.v.view().data(), local.v.dtype(), size_t(i)))));
  job.world.all_reduce(&max_v, 1, ReduceOp::kMax);
  if (params.dropout_prob > 0) max_v /= 1.0 - params.dropout_prob;
  // Large logits move P by f32's rounding of them, however exact the kernel: each row is allowed its own.
  const std::vector<double> row_rounding = logit_rounding(local.inputs(), params, ref.lse);
  const LogitRoundingSummary rounding = summarise(row_rounding, ref.lse, job);
  const double tol = output_tolerance(plan.dtype, max_v);
  const Comparison cmp = compare(o, lse, ref, tol, kLseTolerance, &row_rounding, max_v);
  double err[3] = {cmp.max_abs_error, cmp.max_rel_error, cmp.max_lse_error};
  int64_t wrong = cmp.wrong;
  job.world.all_reduce(err, 3, ReduceOp::kMax);
  job.world.all_reduce(&wrong, 1, ReduceOp::kSum);
  if (rank == 0) {
    if (rounding.unresolved_rows > 0)
      std::printf("ringattn verify: %ld query rows have logits of about %.3g wherever they have weight (a large finite "
                  "bias over all their keys, e.g. -1e9 where a padded query sees nothing): f32 rounds those by more than "
                  "%.2g of a unit, so no f32 kernel resolves their probabilities, and their o (and every gradient) is "
                  "allowed that; -inf in the bias (or a boolean mask) hides pairs without it\n",
                  long(rounding.unresolved_rows), rounding.unresolved_logit, kUnresolvedLogitRounding);
    std::printf("ringattn verify: %s vs f64 reference: max |err| o %.3e (rel %.3e, tolerance %.3e), lse %.3e, #wrong %ld  %s\n",
                output.c_str(), err[0], err[1], tol + 2.0 * max_v * rounding.resolved, err[2], long(wrong),
                wrong ? "FAILED" : "OK");
  }
  if (out_file.has("dq"))
    wrong += verify_gradients(in_file, out_file, plan, local, pos, params, do_dataset, dlse_dataset,
                              std::max(rounding.resolved, rounding.unresolved), foreign, job);
  return wrong ? kWrongResults : kOk;
}

}  // namespace ra::cli
