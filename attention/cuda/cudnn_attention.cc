// `cudnn`: cuDNN's fused attention (cuDNN 9 graph API through cudnn-frontend) as its own
// implementation, as the seeds register it. cuDNN returns each block's output and softmax
// statistics (natural-log LSE); the block is folded into the f32 carry, so the ring can use it.
//
// A call is cut into cuDNN calls by cudnn_blocks (runs of consecutive positions, causal diagonals cuDNN can
// express). What cuDNN cannot express here (bias, mask, segment ids, soft cap, our deterministic dropout,
// sliding windows) is refused by name, pointing at flash_attn2. The backward runs cuDNN's fused SDPA
// backward on the same blocks, adding each block's gradients into the f32 accumulators.
#include <cudnn_frontend.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "attention/cuda/backward_cuda.h"
#include "attention/cuda/carry_cuda.h"
#include "attention/cuda/cudnn_blocks.h"
#include "attention/cuda/cuda_attention.h"
#include "attention/registry.h"
#include "runtime/cuda_device.h"
#include "runtime/graph_capture.h"
#include "runtime/memory.h"

namespace ra {
namespace {

namespace fe = cudnn_frontend;

#define RA_CUDNN_CHECK(call)                                                                         \
  do {                                                                                               \
    cudnnStatus_t ra_status_ = (call);                                                               \
    if (ra_status_ != CUDNN_STATUS_SUCCESS) RA_FAIL(#call, " failed: ", cudnnGetErrorString(ra_status_)); \
  } while (0)

// An SDPA graph with 16-bit inputs and outputs (bf16 or f16) and f32 inside.
std::shared_ptr<fe::graph::Graph> new_graph(DType dtype) {
  refuse_under_capture("building cuDNN's plan for a shape not run before (a warm-up call before the capture builds it)");
  auto graph = std::make_shared<fe::graph::Graph>();
  const fe::DataType_t io = dtype == DType::kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  graph->set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

// cuDNN's logical layout is (B, H, S, D); ours is (B, S, H, D): the strides say so.
std::shared_ptr<fe::graph::Tensor_attributes> graph_tensor(fe::graph::Graph& graph, const char* name, int64_t uid,
                                                           const TensorView& t) {
  return graph.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid)
                          .set_dim({t.dim(0), t.dim(2), t.dim(1), t.dim(3)})
                          .set_stride({t.stride(0), t.stride(2), t.stride(1), 1}));
}

// One built cuDNN graph per shape (B, T, S, H, Hkv, D, Dv), dtype, mask and strides.
using GraphKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, std::array<int64_t, 9>>;
constexpr int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kDO = 6, kDQ = 7, kDK = 8, kDV = 9;

class CudnnAttention final : public CudaAttentionImpl {
 public:
  CudnnAttention() { RA_CUDNN_CHECK(cudnnCreate(&handle_)); }
  ~CudnnAttention() override { (void)cudnnDestroy(handle_); }
  std::string_view name() const override { return "cudnn"; }
  // The installed cuDNN decides (check_supported asks it); this only bounds what validation lets through.
  int64_t max_head_dim() const override { return 512; }

  void check_supported(const AttentionInputs& in, const AttentionParams& p) const override {
    const DType dt = in.q.dtype();
    RA_CHECK(dt == DType::kF16 || dt == DType::kBF16, "q has dtype ", dtype_name(dt),
             ": cudnn attention takes f16 or bf16; use --impl sdpa for f32 on cuda");
    const int64_t D = in.q.dim(3), Dv = in.v.dim(3);
    RA_CHECK(D % 8 == 0 && Dv % 8 == 0, "q dimension 3 (head_dim) is ", D, " and v dimension 3 (v_head_dim) is ", Dv,
             ": cudnn attention needs both multiples of 8; use flash_attn2 or sdpa");
    const std::string& refusal = head_dim_refusal(D, Dv, dt);
    RA_CHECK(refusal.empty(), "q dimension 3 (head_dim) is ", D, " and v dimension 3 (v_head_dim) is ", Dv,
             ": the installed cuDNN (", cudnnGetVersion(), ") does not run it on this GPU at ", dtype_name(dt), " (",
             refusal, "); use flash_attn2 or sdpa");
    // Every option it lacks, named at once (a user who drops one should not meet the next).
    std::vector<std::string> lacking;
    for (auto [given, what] : {std::pair{in.bias.defined(), "a bias"}, {in.mask.defined(), "a mask"},
                               {in.q_segment_ids.defined(), "segment ids"}, {p.logits_soft_cap > 0, "a logits soft cap"},
                               {p.dropout_prob > 0, "ringattn's deterministic dropout"}, {p.has_window(), "a sliding window"}})
      if (given) lacking.push_back(what);
    std::string unsupported;
    for (size_t i = 0; i < lacking.size(); ++i)
      unsupported += (i == 0 ? "" : i + 1 == lacking.size() ? " and " : ", ") + lacking[i];
    RA_CHECK(unsupported.empty(), "cudnn attention cannot express ", unsupported,
             " here; use --impl flash_attn2 (cuda), which supports every option");
    for (auto [t, name] : {std::pair{&in.q, "q"}, std::pair{&in.k, "k"}, std::pair{&in.v, "v"}})
      RA_CHECK(t->stride(3) == 1, name, " must have a contiguous last dimension for cudnn attention");
  }

  void accumulate_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& p,
                         Carry& carry) const override {
    check_supported(in, p);
    for_each_block(in, pos, p, [&](const PositionRun& qr, const PositionRun& kr, CudnnMask mask) {
      run_block(in, qr, kr, mask, p, &carry, nullptr);
    });
  }

  // A call that is one cuDNN block over all its rows and keys: cuDNN's O and LSE are the call's, written
  // into `out` with no carry to zero, fold and finalize (1.1 ms of a 32K training step). A whole block has
  // no empty row (its diagonal is top-left or bottom-right with S >= T), so nothing needs finalize's zeros.
  // Sinks and an f32 O still go through the carry.
  bool forward_direct(const AttentionInputs& in, const AttentionParams& p, const TokenPositions& pos,
                      const ForwardViews& out) const override {
    if (in.sinks.defined() || out.o.dtype() != in.q.dtype()) return false;
    const int64_t T = in.q.dim(1), S = in.k.dim(1);
    if (T == 0 || S == 0) return false;
    check_supported(in, p);
    const std::vector<CudnnBlock> blocks =
        cudnn_blocks(consecutive_runs(pos.q.data(), T), consecutive_runs(pos.k.data(), S), p);
    if (blocks.size() != 1 || blocks[0].q.length != T || blocks[0].k.length != S) return false;
    RA_CUDNN_CHECK(cudnnSetStream(handle_, stream_));
    run_block(in, blocks[0].q, blocks[0].k, blocks[0].mask, p, nullptr, &out);
    return true;
  }

  bool has_backward() const override { return true; }
  bool backward_reads_output() const override { return true; }
  // Each stream has buffers of its own (buffers()), and dQ's rows are added by atomics: the GPU ring's
  // backward runs its own block and the other ranks' blocks on two streams at once.
  bool independent_backward_calls(const AttentionParams& p) const override { return !p.deterministic; }
  // cuDNN's backward holds its SMs to the end: beside another call it shares the GPU with it, whatever the
  // streams' priorities (2 H100, bench/RESULTS.md: the other rank's block ended last, its last hop alone).
  bool backward_yields_to_priority() const override { return false; }
  void accumulate_backward_device(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& p,
                                  const BackwardInputs& grad, const GradViews& acc) const override {
    const TensorView stats = checked_stats(in, grad);
    // A call's bf16 dQ, dK, dV and cuDNN's workspace (an f32 dQ) live in this stream's scratch, which keeps
    // its largest size: whole blocks of 1M tokens on 2 GPUs took 20 GiB a stream (two with the ring's second
    // stream) and ran out of memory. Calls of at most about 1 GiB of query rows' dQ and workspace and 1 GiB
    // of key rows' dK and dV instead; every chunk's gradients add into the accumulators as a block's do.
    const int64_t elem = int64_t(dtype_size(in.q.dtype()));
    const int64_t q_row_bytes = in.q.dim(0) * in.q.dim(2) * in.q.dim(3) * (elem + 4);
    const int64_t k_row_bytes = in.k.dim(0) * in.k.dim(2) * (in.k.dim(3) + in.v.dim(3)) * elem;
    constexpr int64_t kChunkBytes = int64_t(1) << 30;
    const int64_t max_q_rows = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, q_row_bytes));
    const int64_t max_k_rows = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, k_row_bytes));
    const std::vector<CudnnBlock> blocks = blocks_of(in, pos, p, max_q_rows, max_k_rows);
    // kv_unset: each block writes the key rows it is the first to cover and adds into the rest; rows no
    // block covers are zeroed (no zeroed accumulator read back: 8 of the 14 bytes an element cost).
    KeyRowWrites writes;
    if (acc.kv_unset) {
      writes = key_row_writes(blocks, in.k.dim(1));
      for (const RowSpan& s : writes.uncovered) {
        zero_rows_cuda(narrow(acc.dk, 1, s.index, s.length), stream_);
        zero_rows_cuda(narrow(acc.dv, 1, s.index, s.length), stream_);
      }
    }
    for (size_t i = 0; i < blocks.size(); ++i)
      run_backward_block(in, grad, stats, blocks[i].q, blocks[i].k, blocks[i].mask, p, &acc, nullptr,
                         acc.kv_unset ? &writes.per_block[i] : nullptr);
  }
  bool writes_unset_kv() const override { return true; }

  // One block covering the whole call (dense positions): cuDNN writes dq, dk, dv in q's dtype itself,
  // with no f32 accumulators and no delta of ours (cuDNN computes it from O).
  bool backward_into(const AttentionInputs& in, const TokenPositions& pos, const AttentionParams& p,
                     const BackwardInputs& grad, Gradients& out, const GradViews* into) const override {
    const std::vector<PositionRun> q_runs = consecutive_runs(pos.q.data(), int64_t(pos.q.size()));
    const std::vector<PositionRun> k_runs = consecutive_runs(pos.k.data(), int64_t(pos.k.size()));
    if (q_runs.size() != 1 || k_runs.size() != 1 || !writes_into_views(into)) return false;
    check_supported(in, p);
    const TensorView stats = checked_stats(in, grad);
    const GradViews direct = gradients_in_q_dtype(in, out, into);
    const DevicePositions device_pos = positions_.upload(pos, stream_);
    for_each_block(in, device_pos, p, [&](const PositionRun& qr, const PositionRun& kr, CudnnMask mask) {
      run_backward_block(in, grad, stats, qr, kr, mask, p, nullptr, &direct);
    });
    return true;
  }

 private:
  // Calls fn(query run, key run, mask) for each cuDNN call of the pairs of runs of consecutive positions
  // (cudnn_blocks), each of at most max_q_rows x max_k_rows (0: no limit).
  template <typename Fn>
  void for_each_block(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& p, Fn&& fn) const {
    for (const CudnnBlock& block : blocks_of(in, pos, p)) fn(block.q, block.k, block.mask);
  }
  // The cuDNN calls of the call (cudnn_blocks), with the handle on this stream.
  std::vector<CudnnBlock> blocks_of(const AttentionInputs& in, const DevicePositions& pos, const AttentionParams& p,
                                    int64_t max_q_rows = 0, int64_t max_k_rows = 0) const {
    RA_CHECK(pos.q_host != nullptr && pos.k_host != nullptr, "cudnn attention needs the token positions on the host");
    RA_CUDNN_CHECK(cudnnSetStream(handle_, stream_));
    const int64_t T = in.q.dim(1), S = in.k.dim(1);
    const std::vector<PositionRun> q_runs = consecutive_runs(pos.q_host, T), k_runs = consecutive_runs(pos.k_host, S);
    RA_CHECK(q_runs.size() <= 8 && k_runs.size() <= 8, "cudnn attention runs on blocks of consecutive positions; "
             "these rows form ", q_runs.size(), " x ", k_runs.size(), " runs (the striped layout?): use --layout "
             "contiguous or zigzag, or --impl flash_attn2");
    return cudnn_blocks(q_runs, k_runs, p, max_q_rows, max_k_rows);
  }

  // O and dO as cuDNN needs them, and its stats: cuDNN recomputes P = exp(S - stats), so a row that
  // saw nothing (LSE -inf) would give exp(+inf); its stats become +inf, so P = 0 and it adds nothing.
  TensorView checked_stats(const AttentionInputs& in, const BackwardInputs& grad) const {
    RA_CHECK(grad.o.defined() && grad.o.memory() == MemoryKind::kCuda && grad.o.stride(3) == 1,
             "cudnn's backward needs the forward's o on the device (it computes delta from o and do)");
    RA_CHECK(!grad.d_lse.defined(), "cudnn's backward forms rowsum(do * o) itself: it takes no gradient with "
             "respect to lse (dlse); use flash_attn2 or sdpa");
    RA_CHECK(grad.d_o.dtype() == in.q.dtype() && grad.o.dtype() == in.q.dtype() && grad.d_o.stride(3) == 1,
             "cudnn's backward needs o and do in q's dtype (", dtype_name(in.q.dtype()), ") with a contiguous last "
             "dimension; do is ", dtype_name(grad.d_o.dtype()), ", o ", dtype_name(grad.o.dtype()));
    return finite_or_positive_infinity(grad.lse, buffers().stats, stream_);
  }

  // One (query run, key run) block of the backward: cuDNN's dQ, dK, dV in the input dtype, added into
  // the f32 accumulators at the runs' rows (acc), or written straight into `direct` (one block only;
  // contiguous views in q's dtype).
  // key_spans (under GradViews::kv_unset): which of the key run's rows this block writes first (key_row_writes).
  void run_backward_block(const AttentionInputs& in, const BackwardInputs& grad, const TensorView& stats,
                          const PositionRun& qr, const PositionRun& kr, CudnnMask mask, const AttentionParams& p,
                          const GradViews* acc, const GradViews* direct,
                          const std::vector<RowSpan>* key_spans = nullptr) const {
    const TensorView q = narrow(in.q, 1, qr.index, qr.length), o = narrow(grad.o, 1, qr.index, qr.length);
    const TensorView d_o = narrow(grad.d_o, 1, qr.index, qr.length);
    const TensorView k = narrow(in.k, 1, kr.index, kr.length), v = narrow(in.v, 1, kr.index, kr.length);
    const int64_t B = q.dim(0), Tq = q.dim(1), H = q.dim(2), D = q.dim(3), Dv = v.dim(3), Sk = k.dim(1), Hkv = k.dim(2);
    // cuDNN before 9.26 reads stats only packed: a run of fewer rows than the call's (the ring's zigzag
    // and striped shards) gets its rows of stats copied out.
    const int64_t T = in.q.dim(1);
    const float* run_stats = stats.data_as<float>() + qr.index;
    if (Tq != T) {
      float* packed = call_scratch(buffers().stats_run, size_t(B * H * Tq) * sizeof(float), stream_,
                                   "cudnn's packed stats").data_as<float>();
      RA_CUDA_CHECK(cudaMemcpy2DAsync(packed, size_t(Tq) * sizeof(float), run_stats, size_t(T) * sizeof(float),
                                      size_t(Tq) * sizeof(float), size_t(B * H), cudaMemcpyDeviceToDevice, stream_));
      run_stats = packed;
    }
    const GraphKey key{B, Tq, Sk, H, Hkv, D, Dv, int(q.dtype()) + 100 * int(Tq), int(mask) + 16 * int(p.deterministic),
                       {q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), o.stride(1),
                        d_o.stride(1), v.stride(1)}};
    auto it = backward_graphs_.find(key);
    if (it == backward_graphs_.end()) {
      fe::error_t status;
      auto graph = make_backward_graph(q, k, v, o, d_o, Tq, mask, effective_scale(p, D), p.deterministic, status);
      RA_CHECK(status.is_good(), "cudnn cannot run the backward of this attention block (B=", B, " T=", Tq, " S=", Sk,
               " H=", H, " Hkv=", Hkv, " D=", D, " Dv=", Dv, "): ", status.get_message(),
               "; use --impl flash_attn2 or sdpa");
      it = backward_graphs_.emplace(key, std::move(graph)).first;
    }
    fe::graph::Graph& graph = *it->second;
    const size_t elem = dtype_size(q.dtype());
    const size_t dq_bytes = size_t(B * Tq * H * D) * elem, dk_bytes = size_t(B * Sk * Hkv * D) * elem;
    const size_t dv_bytes = size_t(B * Sk * Hkv * Dv) * elem;
    int64_t workspace_bytes = 0;
    RA_CHECK(graph.get_workspace_size(workspace_bytes).is_good(), "cudnn: querying the workspace size failed");
    auto align = [](size_t n) { return (n + 255) / 256 * 256; };
    const size_t outputs = direct ? 0 : align(dq_bytes) + align(dk_bytes) + align(dv_bytes);
    char* scratch = reserve(outputs + size_t(workspace_bytes) + 256);
    char* dq = direct ? static_cast<char*>(direct->dq.data()) : scratch;
    char* dk = direct ? static_cast<char*>(direct->dk.data()) : dq + align(dq_bytes);
    char* dv = direct ? static_cast<char*>(direct->dv.data()) : dk + align(dk_bytes);
    char* workspace = scratch + outputs;
    std::unordered_map<int64_t, void*> pack = {
        {kQ, q.data()},   {kK, k.data()},   {kV, v.data()},   {kO, o.data()}, {kDO, d_o.data()},
        {kStats, const_cast<float*>(run_stats)}, {kDQ, dq}, {kDK, dk}, {kDV, dv}};
    fe::error_t status = graph.execute(handle_, pack, workspace);
    RA_CHECK(status.is_good(), "cudnn's attention backward failed to run: ", status.get_message());
    if (direct) return;
    add_rows_cuda(narrow(acc->dq, 1, qr.index, qr.length), TensorView(dq, q.dtype(), {B, Tq, H, D}, MemoryKind::kCuda), stream_,
                  independent_backward_calls(p));
    put_key_rows(acc->dk, TensorView(dk, q.dtype(), {B, Sk, Hkv, D}, MemoryKind::kCuda), kr, key_spans);
    put_key_rows(acc->dv, TensorView(dv, q.dtype(), {B, Sk, Hkv, Dv}, MemoryKind::kCuda), kr, key_spans);
  }

  // A block's dK or dV (from: (B, rows of kr, Hkv, X), contiguous) into the accumulator's rows of kr: added,
  // or written where key_spans says the block is the first to cover them.
  void put_key_rows(const TensorView& into, const TensorView& from, const PositionRun& kr,
                    const std::vector<RowSpan>* key_spans) const {
    if (!key_spans) return add_rows_cuda(narrow(into, 1, kr.index, kr.length), from, stream_);
    const bool whole = key_spans->size() == 1;  // else a span's rows are contiguous in `from` one batch at a time
    for (const RowSpan& s : *key_spans)
      for (int64_t b = 0; b < (whole ? 1 : from.dim(0)); ++b) {
        TensorView to = narrow(into, 1, s.index, s.length), part = narrow(from, 1, s.index - kr.index, s.length);
        if (!whole) to = narrow(to, 0, b, 1), part = narrow(part, 0, b, 1);
        if (s.first) write_rows_cuda(to, part, stream_);
        else add_rows_cuda(to, part, stream_);
      }
  }

  // cuDNN's SDPA backward graph for these views; stats is (B, H, T) with T the run's rows (packed).
  std::shared_ptr<fe::graph::Graph> make_backward_graph(const TensorView& q, const TensorView& k, const TensorView& v,
                                                        const TensorView& o, const TensorView& d_o, int64_t T,
                                                        CudnnMask mask, float scale, bool deterministic,
                                                        fe::error_t& status) const {
    auto graph = new_graph(q.dtype());
    auto tensor = [&](const char* name, int64_t uid, const TensorView& t) { return graph_tensor(*graph, name, uid, t); };
    auto Q = tensor("Q", kQ, q), K = tensor("K", kK, k), V = tensor("V", kV, v), O = tensor("O", kO, o);
    auto dO = tensor("dO", kDO, d_o);
    const int64_t B = q.dim(0), Tq = q.dim(1), H = q.dim(2), D = q.dim(3), Dv = v.dim(3), Sk = k.dim(1), Hkv = k.dim(2);
    auto stats = graph->tensor(fe::graph::Tensor_attributes().set_name("stats").set_uid(kStats)
                                   .set_dim({B, H, Tq, 1}).set_stride({H * T, T, 1, 1})
                                   .set_data_type(fe::DataType_t::FLOAT));
    auto options = fe::graph::SDPA_backward_attributes().set_name("ringattn_block_backward").set_attn_scale(scale);
    if (mask == CudnnMask::kCausalTopLeft) options.set_causal_mask(true);
    if (mask == CudnnMask::kCausalBottomRight) options.set_causal_mask_bottom_right(true);
    options.set_deterministic_algorithm(deterministic);  // dQ without atomics (--deterministic)
    auto [dQ, dK, dV] = graph->sdpa_backward(Q, K, V, O, dO, stats, options);
    dQ->set_output(true).set_uid(kDQ).set_dim({B, H, Tq, D}).set_stride({Tq * H * D, D, H * D, 1});
    dK->set_output(true).set_uid(kDK).set_dim({B, Hkv, Sk, D}).set_stride({Sk * Hkv * D, D, Hkv * D, 1});
    dV->set_output(true).set_uid(kDV).set_dim({B, Hkv, Sk, Dv}).set_stride({Sk * Hkv * Dv, Dv, Hkv * Dv, 1});
    status = graph->build(handle_, {fe::HeurMode_t::A});
    return graph;
  }

  // One block's O and LSE folded into the carry, or written into `direct` (a whole call; contiguous views).
  void run_block(const AttentionInputs& in, const PositionRun& qr, const PositionRun& kr, CudnnMask mask,
                 const AttentionParams& p, Carry* carry, const ForwardViews* direct) const {
    const TensorView q = narrow(in.q, 1, qr.index, qr.length);
    const TensorView k = narrow(in.k, 1, kr.index, kr.length), v = narrow(in.v, 1, kr.index, kr.length);
    const int64_t B = q.dim(0), Tq = q.dim(1), H = q.dim(2), D = q.dim(3), Dv = v.dim(3), Sk = k.dim(1), Hkv = k.dim(2);
    const GraphKey key{B, Tq, Sk, H, Hkv, D, Dv, int(q.dtype()), int(mask),
                       {q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0),
                        v.stride(1), v.stride(2)}};
    fe::graph::Graph& graph = graph_for(key, q, k, v, mask, effective_scale(p, D));
    // The block's O (B, Tq, H, Dv) and LSE (B, H, Tq) in scratch buffers that grow as needed, unless direct.
    const size_t o_bytes = direct ? 0 : size_t(B * Tq * H * Dv) * dtype_size(q.dtype());
    const size_t lse_bytes = direct ? 0 : size_t(B * H * Tq) * 4;
    int64_t workspace_bytes = 0;
    RA_CHECK(graph.get_workspace_size(workspace_bytes).is_good(), "cudnn: querying the workspace size failed");
    char* scratch = reserve(o_bytes + lse_bytes + size_t(workspace_bytes) + 256);
    void* o = direct ? direct->o.data() : scratch;
    void* lse = direct ? direct->lse.data() : scratch + (o_bytes + 127) / 128 * 128;
    void* workspace = scratch + (o_bytes + 127) / 128 * 128 + (lse_bytes + 127) / 128 * 128;
    std::unordered_map<int64_t, void*> pack = {{kQ, q.data()}, {kK, k.data()}, {kV, v.data()}, {kO, o}, {kStats, lse}};
    fe::error_t status = graph.execute(handle_, pack, workspace);
    RA_CHECK(status.is_good(), "cudnn attention failed to run: ", status.get_message());
    if (direct) return;
    fold_output_lse_cuda(*carry, TensorView(o, q.dtype(), {B, Tq, H, Dv}, MemoryKind::kCuda),
                         TensorView(lse, DType::kF32, {B, H, Tq}, MemoryKind::kCuda), qr.index, stream_);
  }

  // Whether this cuDNN runs head dims (D, Dv) at this dtype here, asked once per (D, Dv, dtype) by
  // building a small graph: its support differs by version and GPU, so nothing is assumed. "" when it runs.
  const std::string& head_dim_refusal(int64_t D, int64_t Dv, DType dt) const {
    const auto key = std::tuple{D, Dv, int(dt)};
    auto it = head_dim_refusals_.find(key);
    if (it != head_dim_refusals_.end()) return it->second;
    const TensorView probe_qk(nullptr, dt, {1, 128, 1, D}, MemoryKind::kCuda);
    const TensorView probe_v(nullptr, dt, {1, 128, 1, Dv}, MemoryKind::kCuda);
    fe::error_t status;
    make_graph(probe_qk, probe_qk, probe_v, CudnnMask::kCausalBottomRight, 1.0f, status);
    return head_dim_refusals_.emplace(key, status.is_good() ? "" : status.get_message()).first->second;
  }

  fe::graph::Graph& graph_for(const GraphKey& key, const TensorView& q, const TensorView& k, const TensorView& v,
                              CudnnMask mask, float scale) const {
    auto it = graphs_.find(key);
    if (it != graphs_.end()) return *it->second;
    fe::error_t status;
    auto graph = make_graph(q, k, v, mask, scale, status);
    RA_CHECK(status.is_good(), "cudnn cannot run this attention block (B=", q.dim(0), " T=", q.dim(1), " S=", k.dim(1),
             " H=", q.dim(2), " Hkv=", k.dim(2), " D=", q.dim(3), " Dv=", v.dim(3), "): ", status.get_message(),
             "; use --impl flash_attn2");
    return *graphs_.emplace(key, std::move(graph)).first->second;
  }

  // cuDNN's SDPA graph for these views (their shapes and strides; data is bound at execution).
  std::shared_ptr<fe::graph::Graph> make_graph(const TensorView& q, const TensorView& k, const TensorView& v,
                                               CudnnMask mask, float scale, fe::error_t& status) const {
    auto graph = new_graph(q.dtype());
    auto tensor = [&](const char* name, int64_t uid, const TensorView& t) { return graph_tensor(*graph, name, uid, t); };
    auto Q = tensor("Q", kQ, q), K = tensor("K", kK, k), V = tensor("V", kV, v);
    auto options = fe::graph::SDPA_attributes().set_name("ringattn_block").set_generate_stats(true).set_attn_scale(scale);
    if (mask == CudnnMask::kCausalTopLeft) options.set_causal_mask(true);
    if (mask == CudnnMask::kCausalBottomRight) options.set_causal_mask_bottom_right(true);
    auto [O, stats] = graph->sdpa(Q, K, V, options);
    const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), Dv = v.dim(3);
    O->set_output(true).set_uid(kO).set_dim({B, H, T, Dv}).set_stride({T * H * Dv, Dv, H * Dv, 1});
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
    status = graph->build(handle_, {fe::HeurMode_t::A});
    return graph;
  }

  char* reserve(size_t bytes) const {
    Tensor& scratch = buffers().scratch;
    const bool captured = cuda_stream_capturing(stream_);  // then the scratch is the captured call's
    if (!captured && scratch.view().nbytes() < bytes) RA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // old one in use
    return static_cast<char*>(call_scratch(scratch, bytes, stream_, "cudnn's block outputs and workspace").data());
  }

  // This stream's outputs and workspaces (scratch), LSE with +inf for empty rows (stats) and a run's packed
  // stats; grow-only: a free inside a ring step would wait for the device.
  struct StreamBuffers {
    Tensor scratch, stats, stats_run;
  };
  StreamBuffers& buffers() const { return buffers_[stream_]; }

  cudnnHandle_t handle_ = nullptr;
  mutable std::map<GraphKey, std::shared_ptr<fe::graph::Graph>> graphs_, backward_graphs_;
  mutable std::map<std::tuple<int64_t, int64_t, int>, std::string> head_dim_refusals_;
  mutable std::map<cudaStream_t, StreamBuffers> buffers_;
};

}  // namespace

void register_cudnn_implementation(AttentionRegistry& registry) {
  registry.register_impl({"cudnn", "cudnn_attention"}, Backend::kCuda,
                         [](const RingContext*) { return std::make_unique<CudnnAttention>(); });
}

}  // namespace ra
