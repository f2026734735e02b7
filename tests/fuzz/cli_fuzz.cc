// libFuzzer target: the CLI's option parsing (ra::cli::parse: bare words, prefixes) and value checks
// (AttentionOptions, --window, --mesh, --layout) on arbitrary argument lists. Errors must be ra::Error or Boost's parse errors, never a
// crash, an overflow, or a wrapped negative number.
#include <boost/program_options.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "launch/cli_options.h"
#include "mesh/mesh_shape.h"
#include "runtime/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Arguments are the input split at newlines.
  std::vector<std::string> args{"run"};
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      args.push_back(current);
      current.clear();
    } else {
      current += char(data[i]);
    }
  }
  if (!current.empty()) args.push_back(current);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ra::cli::AttentionOptions opts;
  std::string input, output;
  namespace po = boost::program_options;
  po::options_description desc("fuzz");
  desc.add_options()("input", po::value(&input))("output", po::value(&output));
  ra::cli::add_attention_options(desc, opts, {"blockwise", "cudnn", "flash_attn2", "ring", "sdpa"});
  try {
    if (!ra::cli::parse(int(argv.size()), argv.data(), desc, "fuzz")) return 0;  // --help
    const ra::AttentionParams params = ra::cli::to_params(opts);
    (void)ra::cli::chosen_layout(opts);
    const ra::MeshShape shape = ra::MeshShape::parse(ra::cli::mesh_text(opts, 4));
    (void)shape.size();
    if (params.window_left < -1 || params.window_right < -1) __builtin_trap();  // must have been refused
  } catch (const ra::Error&) {
  } catch (const po::error&) {
  }
  return 0;
}
