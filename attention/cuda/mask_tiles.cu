#include "attention/cuda/mask_tiles.h"

#include <climits>
#include <mutex>
#include <vector>

#include "attention/cuda/mask_tile.cuh"
#include "runtime/cuda_device.h"
#include "runtime/graph_capture.h"
#include "runtime/kept_temporaries.h"

namespace ra {
namespace {

constexpr int kThreads = 128, kKeyChunks = kMaskTileKeys / 16;  // a thread reads 16 keys of every 16th row

constexpr int kPasses = kMaskChunkRows / (kThreads / kKeyChunks);  // rows a thread reads

// The tiles the mask keeps a pair of and those it keeps whole, counted in kCountSpread pairs of counters (tile by tile
// in turn: one pair would take every block's atomic at one address), summed on the host.
constexpr int kCountSpread = 64, kCounts = 2 * kCountSpread;

// Whether each of the 16 bytes in `words` is non-zero (some, all).
__device__ __forceinline__ void kept_of_16(const uint32_t (&words)[4], bool& some, bool& all) {
#pragma unroll
  for (uint32_t w : words) {
    some = some || w != 0;
    all = all && ((w - 0x01010101u) & ~w & 0x80808080u) == 0;  // no zero byte
  }
}

// 16 bytes from `from` as words: four of 4 bytes where 4-byte aligned, else byte by byte.
__device__ __forceinline__ void words_of_16(const uint8_t* from, uint32_t (&words)[4]) {
  if (reinterpret_cast<uintptr_t>(from) % 4 == 0) {
    for (int i = 0; i < 4; ++i) words[i] = reinterpret_cast<const uint32_t*>(from)[i];
  } else {
    for (int i = 0; i < 4; ++i)
      words[i] = from[4 * i] | from[4 * i + 1] << 8 | from[4 * i + 2] << 16 | uint32_t(from[4 * i + 3]) << 24;
  }
}

// One block per (key tile, row chunk, map): whether the mask keeps some / all of the tile's pairs in range (as the
// mask instances read it: local query rows, keys by position), and the chunk's and tile's ranges widened to it.
__global__ void mask_tiles_kernel(const __grid_constant__ CudaAttentionArgs a, uint8_t* states, int* firsts, int* lasts,
                                  int* counts) {
  const DeviceMaskTiles& t = a.mask_tiles;
  const int tile = blockIdx.x, chunk = blockIdx.y, map = blockIdx.z;
  const int key0 = tile * kMaskTileKeys + 16 * int(threadIdx.x % kKeyChunks), r0 = threadIdx.x / kKeyChunks;
  const DeviceView4& mask = a.mask;
  const uint8_t* head =
      static_cast<const uint8_t*>(mask.data) + (map / t.heads) * mask.stride[0] + (map % t.heads) * mask.stride[1];
  const int keys_in = min(16, a.kv_len - key0);
  int64_t first_pos = 0;
  const bool run = flash::mask_keys_run(a, key0, keys_in, first_pos);
  bool some = false, all = true;
  if (run && (reinterpret_cast<uintptr_t>(head + first_pos) | uintptr_t(mask.stride[2])) % 16 == 0) {
    // Every row's 16 bytes aligned: the thread's rows as 16-byte loads, all in flight at once (the summary reads the
    // whole mask, a GB at T = S = 32768: at the memory's rate, not at its latency).
    uint4 v[kPasses];
#pragma unroll
    for (int n = 0; n < kPasses; ++n) {
      const int r = chunk * kMaskChunkRows + r0 + n * (kThreads / kKeyChunks);
      if (r < a.q_len) v[n] = *reinterpret_cast<const uint4*>(head + int64_t(r) * mask.stride[2] + first_pos);
    }
#pragma unroll
    for (int n = 0; n < kPasses; ++n)
      if (chunk * kMaskChunkRows + r0 + n * (kThreads / kKeyChunks) < a.q_len) {
        const uint32_t words[4] = {v[n].x, v[n].y, v[n].z, v[n].w};
        kept_of_16(words, some, all);
      }
  } else {
    for (int r = chunk * kMaskChunkRows + r0; r < min((chunk + 1) * kMaskChunkRows, a.q_len); r += kThreads / kKeyChunks) {
      const uint8_t* row = head + int64_t(r) * mask.stride[2];
      if (run) {
        uint32_t words[4];
        words_of_16(row + first_pos, words);
        kept_of_16(words, some, all);
      } else {
        for (int i = 0; i < keys_in; ++i) {
          const bool kept = row[flash::k_position(a.pos, key0 + i) * mask.stride[3]] != 0;
          some = some || kept, all = all && kept;
        }
      }
    }
  }
  some = __syncthreads_or(some);
  all = __syncthreads_and(all);
  if (threadIdx.x != 0) return;
  const uint8_t state = some ? kMaskTileSome | (all ? kMaskTileAll : 0) : 0;
  states[flash::mask_state_at(t, map, tile, chunk)] = state;
  if (!some) return;
  const int64_t chunk_at = flash::mask_chunk_range_at(t, map, chunk);
  const int64_t tile_at = flash::mask_tile_range_at(t, map, tile);
  atomicMin(firsts + chunk_at, tile), atomicMax(lasts + chunk_at, tile);
  atomicMin(firsts + tile_at, chunk), atomicMax(lasts + tile_at, chunk);
  int* count = counts + 2 * (tile % kCountSpread);
  atomicAdd(count, 1);
  if (all) atomicAdd(count + 1, 1);
}

// The summary's shape for args (no pointers yet), or maps = 0 where args has no mask or too many chunks for a grid.
DeviceMaskTiles shape_of(const CudaAttentionArgs& a) {
  DeviceMaskTiles t;
  if (!a.mask.data || a.q_len == 0 || a.kv_len == 0) return t;
  t.per_batch = a.mask.stride[0] != 0 && a.batch > 1;
  t.heads = a.mask.stride[1] != 0 ? a.q_heads : 1;
  t.row_chunks = (a.q_len + kMaskChunkRows - 1) / kMaskChunkRows;
  t.key_tiles = (a.kv_len + kMaskTileKeys - 1) / kMaskTileKeys;
  const int maps = (t.per_batch ? a.batch : 1) * t.heads;
  if (t.row_chunks > 65535 || maps > 65535) return t;  // a grid's y and z: left unsummarised (nothing skipped)
  t.maps = maps;
  return t;
}

size_t ranges_of(const DeviceMaskTiles& t) { return size_t(t.maps) * (t.row_chunks + t.key_tiles); }
size_t bytes_of(const DeviceMaskTiles& t) {
  return (2 * ranges_of(t) + kCounts) * sizeof(int) + size_t(t.maps) * t.row_chunks * t.key_tiles;
}
int* counts_in(void* summary, const DeviceMaskTiles& t) { return static_cast<int*>(summary) + 2 * ranges_of(t); }

// Queues the summary of a's mask into `summary` (bytes_of(t) bytes) on `stream`; returns t pointing into it.
DeviceMaskTiles summarise(CudaAttentionArgs a, DeviceMaskTiles t, void* summary, cudaStream_t stream) {
  const size_t ranges = ranges_of(t);
  int* firsts = static_cast<int*>(summary);
  int* lasts = firsts + ranges;
  int* counts = counts_in(summary, t);
  uint8_t* states = reinterpret_cast<uint8_t*>(counts + kCounts);
  a.mask_tiles = t;
  // firsts start past any tile or chunk (0x7f7f7f7f), lasts before any (-1): min and max take the kept ones.
  RA_CUDA_CHECK(cudaMemsetAsync(firsts, 0x7f, ranges * sizeof(int), stream));
  RA_CUDA_CHECK(cudaMemsetAsync(lasts, 0xff, ranges * sizeof(int), stream));
  RA_CUDA_CHECK(cudaMemsetAsync(counts, 0, kCounts * sizeof(int), stream));
  mask_tiles_kernel<<<dim3(unsigned(t.key_tiles), unsigned(t.row_chunks), unsigned(t.maps)), kThreads, 0, stream>>>(
      a, states, firsts, lasts, counts);
  RA_CUDA_CHECK(cudaGetLastError());
  t.states = states, t.firsts = firsts, t.lasts = lasts;
  return t;
}

// All a kept summary depends on: the caller's name for the mask's bytes, where they are, and how the call reads them.
struct KeptKey {
  uint64_t identity = 0;
  int device = -1;
  const void* mask = nullptr;
  int64_t strides[4] = {};
  int batch = 0, q_heads = 0, q_len = 0, kv_len = 0;
  int64_t first_key = 0;
  bool operator==(const KeptKey&) const = default;
};

KeptKey key_of(const CudaAttentionArgs& a, int device) {
  KeptKey key;
  key.identity = a.mask_identity, key.device = device, key.mask = a.mask.data;
  for (int i = 0; i < 4; ++i) key.strides[i] = a.mask.stride[i];
  key.batch = a.batch, key.q_heads = a.q_heads, key.q_len = a.q_len, key.kv_len = a.kv_len;
  key.first_key = a.pos.k_run;
  return key;
}

}  // namespace

// A summary kept for later calls. Its memory goes back in stream order once the last kernel that read it is done
// (last_use, recorded after each), on the thread's own stream: the streams that read it may be gone by then.
struct KeptMaskTiles {
  KeptKey key;
  DeviceMaskTiles tiles;
  void* memory = nullptr;
  CudaEvent last_use;
  const int* counts = nullptr;  // the host's copy (KeptSummaries' slots), there once `counted` has completed
  CudaEvent counted;
  bool decided = false, keeps_tiles_whole = false;

  ~KeptMaskTiles() {  // (not ScopedCudaDevice, whose failures throw: a destructor must not)
    if (!memory) return;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) return;
    (void)cudaSetDevice(key.device);
    (void)cudaStreamWaitEvent(cudaStreamPerThread, last_use.get(), 0);
    cuda_release_temporary(memory, cudaStreamPerThread);
    (void)cudaSetDevice(current);
  }
};

namespace {

// The kept summaries, the most recently used last. A few: a model's layers share one mask, and each summary is a
// byte a tile (2 MB for a 32768 x 131072 mask). Never destroyed: at exit the driver takes their memory back.
class KeptSummaries {
 public:
  static constexpr size_t kCapacity = 8;

  std::shared_ptr<KeptMaskTiles> find_or_make(CudaAttentionArgs& a, const DeviceMaskTiles& shape, cudaStream_t stream,
                                              bool& keeps_tiles_whole) {
    int device = 0;
    RA_CUDA_CHECK(cudaGetDevice(&device));
    const KeptKey key = key_of(a, device);
    std::shared_ptr<KeptMaskTiles> dropped;
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    for (auto it = kept_.begin(); it != kept_.end(); ++it)
      if ((*it)->key == key) {
        std::shared_ptr<KeptMaskTiles> found = *it;
        kept_.erase(it);
        kept_.push_back(found);
        // After the summary is made, and after other streams' reads of it (so that last_use covers them all).
        RA_CUDA_CHECK(cudaStreamWaitEvent(stream, found->last_use.get(), 0));
        if (!found->decided && cudaEventQuery(found->counted.get()) == cudaSuccess) decide(*found);
        keeps_tiles_whole = found->keeps_tiles_whole;
        return found;
      }
    auto made = std::make_shared<KeptMaskTiles>();
    made->key = key;
    made->memory = cuda_allocate_temporary(bytes_of(shape), stream, "the mask's tile summary");
    made->tiles = summarise(a, shape, made->memory, stream);  // throws: made's memory goes back on this thread's stream
    made->last_use.record(stream);
    // Its counts to the host, read by a later call once there (the first one runs the plain mask instance).
    if (!count_slots_.defined()) count_slots_ = Tensor(DType::kI32, {kCountSlots * kCounts}, MemoryKind::kPinned);
    int* slot = count_slots_.data<int>() + (next_slot_++ % kCountSlots) * kCounts;
    RA_CUDA_CHECK(cudaMemcpyAsync(slot, counts_in(made->memory, shape), kCounts * sizeof(int), cudaMemcpyDeviceToHost,
                                  stream));
    made->counts = slot;
    made->counted.record(stream);
    keeps_tiles_whole = false;
    kept_.push_back(made);
    if (kept_.size() > kCapacity) {
      dropped = kept_.front();  // released once the lock is let go, and the last call reading it has ended
      kept_.erase(kept_.begin());
    }
    return made;
  }

  int count() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return int(kept_.size());
  }

  // Lets go of every summary (the device cache is being handed back): each goes back once its last reader is done.
  // May run inside find_or_make's allocation on this thread (an allocation that failed drops them): hence the
  // recursive mutex; nothing there holds a position in kept_ across the allocation.
  void drop_all() {
    std::vector<std::shared_ptr<KeptMaskTiles>> dropped;
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    dropped.swap(kept_);
  }

 private:
  // Host copies of the counts: slots taken in turn, twice as many as summaries kept, so that a copy still in flight
  // for a dropped summary lands in a slot no kept one reads (and a stray one would only pick the slower instance).
  // Pinned once and never freed: freeing pinned memory waits for the device.
  static constexpr int kCountSlots = 2 * kCapacity;

  static void decide(KeptMaskTiles& kept) {
    int some = 0, all = 0;
    for (int i = 0; i < kCountSpread; ++i) some += kept.counts[2 * i], all += kept.counts[2 * i + 1];
    kept.keeps_tiles_whole = some > 0 && 2 * all >= some;
    kept.decided = true;
  }

  std::recursive_mutex mutex_;
  std::vector<std::shared_ptr<KeptMaskTiles>> kept_;
  Tensor count_slots_;
  size_t next_slot_ = 0;
};

KeptSummaries& kept_summaries() {
  static auto* kept = [] {
    drop_when_releasing_the_cache([] { kept_summaries().drop_all(); });
    return new KeptSummaries;
  }();
  return *kept;
}

}  // namespace

MaskTiles::MaskTiles(CudaAttentionArgs& a, cudaStream_t stream) : stream_(stream) {
  const DeviceMaskTiles shape = shape_of(a);
  if (shape.maps == 0) return;
  if (a.mask_identity != 0 && a.pos.k_run != DevicePositions::kNotARun && !cuda_stream_capturing(stream)) {
    kept_ = kept_summaries().find_or_make(a, shape, stream, keeps_tiles_whole_);
    a.mask_tiles = kept_->tiles;
    return;
  }
  temporary_ = Tensor::scratch(bytes_of(shape), MemoryKind::kCuda, stream, "the mask's tile summary");
  a.mask_tiles = summarise(a, shape, temporary_.view().data(), stream);
}

MaskTiles::~MaskTiles() {
  if (kept_) kept_->last_use.record(stream_);
}

int kept_mask_tiles_count() { return kept_summaries().count(); }

}  // namespace ra
