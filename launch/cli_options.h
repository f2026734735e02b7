// Command-line options shared by `run`, `verify` and `bench` (Boost.Program_options lives only in
// launch/), and their conversion to AttentionParams with checks that name the option.
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <utility>
#include <vector>

#include "attention/params.h"
#include "launch/sharded_io.h"
#include "mesh/sequence_layout.h"

namespace ra::cli {

namespace po = boost::program_options;

struct AttentionOptions {
  std::string impl = "ring", backend = "cpu", mesh, layout, window, local_impl = "flash_attn2";
  std::string ring_transport = "auto", flash_kernel = "auto";
  bool causal = false;
  double softcap = 0, scale = 0, dropout = 0;
  int64_t block_q = 64, block_k = 64, timeout_s = 60;
  bool no_block_checksums = false, allow_nonfinite = false, deterministic = false;
  uint64_t seed = 0;
  std::vector<std::string> given;  // the options on the command line (parse), for check_options_apply
};

// --grad-wire: the dtype of the backward's dK/dV accumulators between ring steps ("f32" or "bf16").
inline constexpr const char* kGradWireHelp = "with --backward: the dK/dV accumulators between ring steps in f32 "
    "(default) or bf16 (half their traffic; each hop rounds the running sum, so the error grows with the ranks)";

// `implementations`: the registry's names (the help lists what this build runs; cudnn only where built).
void add_attention_options(po::options_description& desc, AttentionOptions& opts,
                           const std::vector<std::string>& implementations);

// --q-dataset ... --segment-ids-dataset: where the inputs sit in the file. An optional dataset named
// on the command line must exist (check_named_datasets), never be skipped silently.
struct DatasetOptions {
  DatasetNames names;
  std::vector<std::pair<std::string, std::string>> named;  // (option, dataset) given on the command line
  std::string qkv_format = "bshd";  // --qkv-format: names.format (set by parse)
};
void add_dataset_options(po::options_description& desc, DatasetOptions& opts);
void check_named_datasets(const DatasetOptions& opts, const H5File& file);
AttentionParams to_params(const AttentionOptions& opts);
// What the options make of attention's result (effective scale, causal, window, soft cap, dropout and its
// seed), not how it is computed: run records it, verify refuses other options by it.
std::string attention_semantics(const AttentionParams& params, int64_t head_dim);
SequenceLayout chosen_layout(const AttentionOptions& opts);  // zigzag when causal, else contiguous
std::string mesh_text(const AttentionOptions& opts, int world_size);  // default: all ranks on sp

// Parses argv after the subcommand; prints help and returns false on --help. A word that is no option
// ("causal" for "--causal") and an option prefix that matches several options are errors. Fills
// `datasets->named` and `given` (every option on the command line, by name) when given.
bool parse(int argc, char** argv, const po::options_description& desc, const char* usage,
           DatasetOptions* datasets = nullptr, std::vector<std::string>* given = nullptr);

// Whether `option` (its name without dashes) was on the command line (parse's `given`).
bool was_given(const AttentionOptions& opts, const char* option);

// Positive integers that must not wrap: "--heads -1" is an error naming the option.
int64_t positive(int64_t value, const char* option);

}  // namespace ra::cli
