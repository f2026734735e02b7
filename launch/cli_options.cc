// Shared CLI options.
#include "launch/cli_options.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "attention/params.h"
#include "runtime/error.h"

namespace ra::cli {

namespace {

// "a | b | c"; the ring's local kernels leave out ring and blockwise.
std::string implementations_text(const std::vector<std::string>& names, bool local) {
  std::string text;
  for (const std::string& name : names) {
    if (local && (name == "ring" || name == "blockwise")) continue;
    text += (text.empty() ? "" : " | ") + name;
  }
  return text;
}

}  // namespace

void add_attention_options(po::options_description& desc, AttentionOptions& o,
                           const std::vector<std::string>& implementations) {
  const std::string impls = "implementation: " + implementations_text(implementations, false);
  const std::string local_impls = "the ring's local kernel: " + implementations_text(implementations, true);
  desc.add_options()
    ("impl", po::value(&o.impl)->default_value("ring"), impls.c_str())
    ("local-impl", po::value(&o.local_impl)->default_value("flash_attn2"), local_impls.c_str())
    ("backend", po::value(&o.backend)->default_value("cpu"), "cpu | cuda | native")
    ("mesh", po::value(&o.mesh), "mesh axes, e.g. sp=4 or dp=2,sp=2 (default: all ranks on sp)")
    ("layout", po::value(&o.layout), "sequence layout: contiguous | zigzag | striped (default: zigzag when causal)")
    ("causal", po::bool_switch(&o.causal), "causal mask (queries aligned to the end of the keys)")
    ("window", po::value(&o.window), "sliding window L,R (-1 for an unbounded side)")
    ("softcap", po::value(&o.softcap)->default_value(0), "logits soft cap (0: off)")
    ("scale", po::value(&o.scale)->default_value(0), "softmax scale (0: 1/sqrt(head_dim))")
    ("dropout", po::value(&o.dropout)->default_value(0), "dropout probability")
    ("dropout-seed", po::value(&o.seed)->default_value(0), "dropout seed")
    ("block-q", po::value(&o.block_q)->default_value(64), "query chunk (blockwise)")
    ("block-k", po::value(&o.block_k)->default_value(64), "key chunk (blockwise)")
    ("ring-transport", po::value(&o.ring_transport)->default_value("auto"), "how the GPU ring moves K/V blocks: "
     "nccl | copy-engines (CUDA IPC within one node; no SMs taken from the kernels) | auto (copy engines where "
     "every rank can use them)")
    ("flash-kernel", po::value(&o.flash_kernel)->default_value("auto"), "the CUDA flash_attn2 kernels (also the "
     "ring's local ones): auto (wgmma on Hopper, else mma.sync) | mma_sync "
     "| wgmma")
    ("timeout", po::value(&o.timeout_s)->default_value(60), "seconds a ring step may wait for its peer")
    ("deterministic", po::bool_switch(&o.deterministic), "bitwise-identical results: on the host ring for any number "
     "of ranks and layout, forward and --backward (an exact max pass and fixed-point sums; tens of times slower); "
     "on cuda the same bits on every run for this ring size and layout (the backward's dQ summed in a fixed order)")
    ("no-block-checksums", po::bool_switch(&o.no_block_checksums), "skip the checksum of K/V blocks in flight")
    ("allow-nonfinite", po::bool_switch(&o.allow_nonfinite), "run even when inputs hold NaN or Inf (reported either way)");
}

bool was_given(const AttentionOptions& o, const char* option) {
  return std::find(o.given.begin(), o.given.end(), option) != o.given.end();
}

int64_t positive(int64_t value, const char* option) {
  RA_CHECK(value > 0, "--", option, " is ", value, ", expected a positive integer");
  return value;
}

std::string attention_semantics(const AttentionParams& p, int64_t head_dim) {
  char text[256];
  std::snprintf(text, sizeof text, "--scale %.9g%s --window %lld,%lld --softcap %.9g --dropout %.9g",
                double(effective_scale(p, head_dim)), p.causal ? " --causal" : "", static_cast<long long>(p.window_left),
                static_cast<long long>(p.window_right), double(p.logits_soft_cap), double(p.dropout_prob));
  std::string out = text;
  if (p.dropout_prob > 0) out += " --dropout-seed " + std::to_string(p.dropout_seed);
  return out;
}

AttentionParams to_params(const AttentionOptions& o) {
  AttentionParams p;
  p.causal = o.causal;
  p.softmax_scale = float(o.scale);
  p.logits_soft_cap = float(o.softcap);
  p.dropout_prob = float(o.dropout);
  p.dropout_seed = o.seed;
  p.block_q = positive(o.block_q, "block-q");
  p.block_k = positive(o.block_k, "block-k");
  p.flash_kernel = parse_flash_kernel(o.flash_kernel, "--flash-kernel");  // refused by make_impl where no kernel takes it
  p.deterministic = o.deterministic;
  positive(o.timeout_s, "timeout");
  if (!o.window.empty()) {
    long long l = 0, r = 0;
    char extra = 0;
    RA_CHECK(std::sscanf(o.window.c_str(), "%lld,%lld%c", &l, &r, &extra) == 2, "--window '", o.window,
             "' is not L,R (two integers, -1 for an unbounded side)");
    RA_CHECK(l >= -1 && r >= -1, "--window ", o.window, " has a negative size: expected L,R >= 0 or -1");
    p.window_left = l;
    p.window_right = r;
  }
  return p;
}

SequenceLayout chosen_layout(const AttentionOptions& o) {
  if (!o.layout.empty()) return parse_layout(o.layout);
  return o.causal ? SequenceLayout::kZigzag : SequenceLayout::kContiguous;
}

std::string mesh_text(const AttentionOptions& o, int world_size) {
  return o.mesh.empty() ? "sp=" + std::to_string(world_size) : o.mesh;
}

void add_dataset_options(po::options_description& desc, DatasetOptions& o) {
  desc.add_options()
    ("q-dataset", po::value(&o.names.q)->default_value(o.names.q), "path of q inside the input file (groups allowed)")
    ("k-dataset", po::value(&o.names.k)->default_value(o.names.k), "path of k")
    ("v-dataset", po::value(&o.names.v)->default_value(o.names.v), "path of v")
    ("mask-dataset", po::value(&o.names.mask)->default_value(o.names.mask), "path of the optional mask (non-zero = attend)")
    ("bias-dataset", po::value(&o.names.bias)->default_value(o.names.bias), "path of the optional additive bias")
    ("sinks-dataset", po::value(&o.names.sinks)->default_value(o.names.sinks),
     "path of the optional attention sinks (q_heads) float32: one logit per head with a zero value row")
    ("segment-ids-dataset", po::value(&o.names.segment_ids)->default_value(o.names.segment_ids),
     "path of the optional segment ids")
    ("cu-seqlens-dataset", po::value(&o.names.cu_seqlens)->default_value(o.names.cu_seqlens),
     "path of the optional cumulative sequence lengths [0, l0, l0 + l1, ..., seq_len] (any integer type) of the "
     "sequences packed into a batch of one row, in place of segment ids")
    ("qkv-format", po::value(&o.qkv_format)->default_value(o.qkv_format), "how q, k, v and do hold their "
     "dimensions, by TransformerEngine's names (o, dq, dk, dv are written alike): bshd (batch, len, heads, dim) | bhsd "
     "(batch, heads, len, dim: PyTorch's scaled_dot_product_attention) | sbhd (len, batch, heads, dim: Megatron's) | "
     "thd (tokens, heads, dim: FlashAttention's varlen, one batch row; cu_seqlens packs sequences)");
}

void check_named_datasets(const DatasetOptions& o, const H5File& file) {
  for (const auto& [option, dataset] : o.named)
    RA_CHECK(file.has(dataset), "--", option, " names dataset '", dataset, "', which '", file.path(),
             "' does not have (or it is a group, not a dataset)");
}

namespace {

bool on_command_line(const po::variables_map& vm, const std::string& option) {
  return vm.count(option) && !vm[option].defaulted();
}

// One dataset in two roles: a role named on the command line takes the path from an optional role's default name
// (--bias-dataset mask: a float mask, 0 / -inf, read as the bias is not also read as a mask, which the file's
// "mask" would otherwise be); an optional role given the path another role was given is refused. (q, k and v may
// share one: tied projections.)
void give_each_dataset_one_role(const po::variables_map& vm, DatasetNames& names) {
  struct Role {
    const char* option;
    std::string* path;
    bool optional;
  };
  const Role roles[] = {{"q-dataset", &names.q, false},
                        {"k-dataset", &names.k, false},
                        {"v-dataset", &names.v, false},
                        {"mask-dataset", &names.mask, true},
                        {"bias-dataset", &names.bias, true},
                        {"sinks-dataset", &names.sinks, true},
                        {"segment-ids-dataset", &names.segment_ids, true},
                        {"cu-seqlens-dataset", &names.cu_seqlens, true}};
  const auto given = [&](const Role& r) { return on_command_line(vm, r.option); };
  std::vector<std::string*> taken;  // optional roles' default paths that a named role took
  for (const Role& a : roles)
    for (const Role& b : roles) {
      if (&a == &b || *a.path != *b.path || !given(a) || !b.optional) continue;
      RA_CHECK(!given(b), "--", a.option, " and --", b.option, " both name dataset '", *a.path,
               "': one dataset cannot be both");
      taken.push_back(b.path);
    }
  for (std::string* path : taken) path->clear();  // an empty path names no dataset: that role is absent
}

}  // namespace

bool parse(int argc, char** argv, const po::options_description& desc, const char* usage, DatasetOptions* datasets,
           std::vector<std::string>* given) {
  po::variables_map vm;
  try {
    // The default style minus guessing: "--no" never stands for one of --no-space-check and
    // --no-block-checksums, and no prefix is completed.
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    const po::parsed_options parsed = po::command_line_parser(argc, argv).options(desc).style(style).run();
    // Without a positional description Boost keeps bare words aside; they are mistakes ("causal").
    const std::vector<std::string> stray = po::collect_unrecognized(parsed.options, po::include_positional);
    if (!stray.empty()) {
      const std::string& word = stray.front();
      const bool is_option = desc.find_nothrow(word, false) != nullptr;
      RA_FAIL("unexpected argument '", word, "'", is_option ? " (did you mean --" + word + "?)" : "",
              ": every option starts with -- (see --help)");
    }
    po::store(parsed, vm);
    if (vm.count("help")) {
      std::cout << usage << "\n" << desc << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error_with_option_name& e) {
    // Boost writes the offending text into its message in a loop that never ends when the text holds
    // a placeholder of its own, e.g. "%option%" (found by fuzzing): with a '%' in any argument the
    // message is ours, naming the option without substitution.
    if (std::any_of(argv, argv + argc, [](const char* arg) { return std::strchr(arg, '%') != nullptr; }))
      RA_FAIL("option '", e.get_option_name(), "' cannot be parsed (unknown, malformed or missing its value; see --help)");
    RA_FAIL(e.what(), " (see --help)");
  } catch (const po::error& e) {
    RA_FAIL(e.what(), " (see --help)");
  }
  if (datasets != nullptr) {
    for (const char* option : {"mask-dataset", "bias-dataset", "sinks-dataset", "segment-ids-dataset", "cu-seqlens-dataset"})
      if (on_command_line(vm, option)) datasets->named.push_back({option, vm[option].as<std::string>()});
    give_each_dataset_one_role(vm, datasets->names);
    datasets->names.format = parse_qkv_format(datasets->qkv_format);
  }
  if (given != nullptr)
    for (const auto& [option, value] : vm)
      if (!value.defaulted()) given->push_back(option);
  return true;
}

}  // namespace ra::cli
