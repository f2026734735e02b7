// `ringattn verify`: recompute each rank's rows with the f64 reference against the whole K/V, compare
// with the output file, count wrong elements over all ranks (nccl-tests style) and fail on any.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "attention/cpu/sdpa_cpu.h"
#include "attention/tolerance.h"
#include "attention/compare.h"
#include "attention/registry.h"
#include "launch/commands.h"
#include "launch/output_manifest.h"
#include "launch/sharded_io.h"

namespace ra::cli {

int cmd_verify(int argc, char** argv, const MpiSession& mpi) {
  AttentionOptions opts;
  DatasetOptions datasets;
  std::string input, output;
  po::options_description desc("ringattn verify");
  desc.add_options()("help", "this text")
    ("input", po::value(&input)->required(), "the input HDF5 file")
    ("output", po::value(&output)->required(), "the output HDF5 file of ringattn run");
  add_dataset_options(desc, datasets);
  add_attention_options(desc, opts, AttentionRegistry::builtin().list_implementations());
  if (!parse(argc, argv, desc, "Usage: mpirun -np N ringattn verify --input F --output G [same attention options]",
             &datasets))
    return kOk;
  const AttentionParams params = to_params(opts);
  Job job(opts, mpi, args_text(argc, argv));
  const int rank = job.world.rank();
  H5File in_file(input, H5File::Mode::kRead, job.world.comm());
  H5File out_file(output, H5File::Mode::kRead, job.world.comm());
  check_named_datasets(datasets, in_file);
  ShardPlan plan = plan_shards(in_file, job.shape, rank, chosen_layout(opts), datasets.names);
  check_host_memory(local_input_bytes(plan, in_file, /*whole_kv=*/true), input, job.world.comm());
  LocalTensors local = read_local(in_file, plan, /*whole_kv=*/true);
  Tensor o, lse;
  read_outputs(out_file, plan, o, lse);
  // The file is what `run` wrote: its manifest's checksums match before any number is compared.
  check_manifest(out_file.string_attribute("manifest"), output_checksums(plan, o, lse, job.world.comm()), output);

  // This rank's queries against every key.
  TokenPositions pos = TokenPositions::dense(plan.q_len, plan.kv_len);
  pos.q = layout_query_positions(plan.layout, plan.q_len, plan.kv_len, plan.sp_size, plan.sp_index);
  ReferenceOutput ref = reference_attention_f64(local.inputs(), params, pos);

  double max_v = 0;
  for (int64_t i = 0; i < local.v.numel(); ++i)
    max_v = std::max(max_v, double(std::fabs(load_as_f32(local.v.view().data(), local.v.dtype(), size_t(i)))));
  job.world.all_reduce(&max_v, 1, ReduceOp::kMax);
  if (params.dropout_prob > 0) max_v /= 1.0 - params.dropout_prob;
  const double tol = output_tolerance(plan.dtype, max_v);
  const Comparison cmp = compare(o, lse, ref, tol, kLseTolerance);
  double err[3] = {cmp.max_abs_error, cmp.max_rel_error, cmp.max_lse_error};
  int64_t wrong = cmp.wrong;
  job.world.all_reduce(err, 3, ReduceOp::kMax);
  job.world.all_reduce(&wrong, 1, ReduceOp::kSum);
  if (rank == 0)
    std::printf("ringattn verify: %s vs f64 reference: max |err| o %.3e (rel %.3e, tolerance %.3e), lse %.3e, #wrong %ld  %s\n",
                output.c_str(), err[0], err[1], tol, err[2], long(wrong), wrong ? "FAILED" : "OK");
  return wrong ? kWrongResults : kOk;
}

}  // namespace ra::cli
