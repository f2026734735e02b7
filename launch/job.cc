// Job setup shared by run, verify and bench.
#include "attention/registry.h"
#include "launch/commands.h"
#include "runtime/error.h"

namespace ra::cli {

// `world` is declared before `shape`, so it exists here.
Job::Job(const AttentionOptions& opts) : shape(MeshShape::parse(mesh_text(opts, world.size()))) {
  RA_CHECK(shape.size() == world.size(), "--mesh ", shape.str(), " has ", shape.size(), " ranks but the job has ",
           world.size(), " (mpirun -np ", world.size(), ")");
  mesh = std::make_unique<DeviceMesh>(shape, world);
}

Communicator& Job::sequence_axis() const { return shape.has_axis("sp") ? mesh->axis("sp") : self; }

std::unique_ptr<AttentionImpl> make_impl(const AttentionOptions& opts, const Job& job, int64_t q_len, int64_t kv_len,
                                         RingContext& ctx) {
  const AttentionRegistry& registry = AttentionRegistry::builtin();
  const std::string name = registry.canonical_name(opts.impl);
  ctx.comm = &job.sequence_axis();
  ctx.layout = chosen_layout(opts);
  ctx.global_q_len = q_len;
  ctx.global_kv_len = kv_len;
  ctx.local_impl = opts.local_impl;
  ctx.step_timeout = std::chrono::seconds(opts.timeout_s);
  RA_CHECK(name == "ring" || ctx.comm->size() == 1, "--impl ", name, " runs on one rank's whole sequence; the mesh's sp axis has ",
           ctx.comm->size(), " ranks: use --impl ring (or a mesh without sp)");
  return registry.create(name, parse_backend(opts.backend), &ctx);
}

}  // namespace ra::cli
