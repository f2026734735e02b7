// The ring's schedule as a pure function of (layout, T, S, ring size, rank), built once and shared by
// both rings (host and GPU, forward and backward), the ring benches and the tests: which rank's K/V
// block each step holds, its keys' global positions, and whether the causal mask or the window leave
// any pair of it visible to this rank's queries.
//
// Blocks are classified per index run (a layout's contiguous or strided pieces: zigzag's two chunks,
// striped's one stride), not by the min / max over all positions: zigzag with a window, or striped with
// a window narrower than the ring, holds blocks that no query sees although their ranges overlap.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/block_kind.h"
#include "attention/params.h"
#include "mesh/sequence_layout.h"

namespace ra {

// At step s of a ring of n ranks, rank r holds the K/V block that started on rank (r - s) mod n.
inline int ring_source_rank(int rank, int step, int n) { return ((rank - step) % n + n) % n; }

// Key-axis positions of the query rows that part `index` of `parts` holds under the layout: global
// query index + (S - T), queries aligned to the end of the keys.
std::vector<int64_t> layout_query_positions(SequenceLayout layout, int64_t q_len, int64_t kv_len, int parts, int index);

class RingSchedule {
 public:
  RingSchedule(SequenceLayout layout, int64_t q_len, int64_t kv_len, int ranks, int rank);

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  int source(int step) const { return ring_source_rank(rank_, step, ranks_); }

  // This rank's query positions (key axis), and the keys of the block that started on rank `source`.
  const std::vector<int64_t>& query_positions() const { return query_positions_; }
  const std::vector<int64_t>& keys(int source) const { return keys_[size_t(source)]; }
  int64_t rows(int source) const { return int64_t(keys(source).size()); }
  std::vector<int64_t> rows_of_each_rank() const;
  int64_t slot_rows() const { return slot_rows_; }  // the most rows any rank's block holds
  // Every rank's keys one after another (one upload for a GPU ring), where rank `source`'s start, and
  // whether each rank's block is ascending (their concatenation need not be).
  std::vector<int64_t> all_keys() const;
  int64_t key_offset(int source) const { return key_offsets_[size_t(source)]; }
  bool keys_sorted() const { return keys_sorted_; }
  // Whether rank `source`'s keys pair up as dropout's decisions do (dropout_keys_pair_up), found once per layout.
  bool keys_pair_up(int source) const { return keys_pair_up_[size_t(source)]; }

  // Keys [first, first + count) of rank `source`'s block against this rank's queries: skipped when no
  // pair is visible under the causal mask and the window (so every block where this rank holds no query),
  // full when every pair is (segment ids, bias and mask are not known here: they never make a block
  // skipped). count < 0: to the block's end.
  BlockKind kind(int source, const AttentionParams& params, int64_t first = 0, int64_t count = -1) const;
  bool skipped(int source, const AttentionParams& params, int64_t first = 0, int64_t count = -1) const {
    return kind(source, params, first, count) == BlockKind::kSkip;
  }

 private:
  int ranks_, rank_;
  std::vector<IndexRun> query_runs_;                // key-axis positions
  std::vector<std::vector<IndexRun>> key_runs_;     // per source rank, in local row order
  std::vector<int64_t> query_positions_;
  std::vector<std::vector<int64_t>> keys_;
  std::vector<int64_t> key_offsets_;
  std::vector<bool> keys_pair_up_;
  int64_t slot_rows_ = 0;
  bool keys_sorted_ = true;
};

// The kind of the pair of index runs (queries `q`, keys `k`, both key-axis positions) under the causal
// mask and the window: exact for runs of one stride, conservative (never skipped wrongly) otherwise.
BlockKind classify_runs(const IndexRun& q, const IndexRun& k, const AttentionParams& params);

}  // namespace ra
