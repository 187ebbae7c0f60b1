// One step of a ragged batch (continuous batching, paged KV cache, as in vLLM's PagedAttention:
// Kwon et al., "Efficient Memory Management for Large Language Model Serving with PagedAttention",
// SOSP 2023).
//
// A step runs n_rows = tokens.size() rows. Rows may belong to different sequences: decode rows
// (one per running sequence) and chunks of prompts (prefill) in one batch. Each row carries its
// own position and its sequence; the rows of one sequence are consecutive in the batch with
// ascending, consecutive positions.
//
// The KV cache is a pool of kv_pool_tokens rows cut into blocks of kv_block_size rows. A sequence
// owns blocks listed in its block table: position p of sequence s lives in pool row
//   block_tables[s][p / kv_block_size] * kv_block_size + p % kv_block_size.
// A row at position p writes its K/V there and attends causally to positions [0, p] of its
// sequence (those written in earlier steps and the rows of this step at positions <= p).
//
// The one-sequence case (`run`, `logits`, `chat`) is a batch with one sequence whose block table
// is 0, 1, 2, ... (pool row == position): exactly the layout of a contiguous per-sequence cache.
#pragma once
#include <cstdint>
#include <vector>

namespace mk {

struct StepBatch {
  std::vector<int32_t> tokens;     // [n_rows] token ids
  std::vector<int32_t> positions;  // [n_rows] position of each row in its sequence (>= 0)
  std::vector<int32_t> seq;        // [n_rows] index into block_tables of each row's sequence
  // Rows whose logits the step returns, ascending (e.g. the last row of each sequence that is
  // ready to sample); forward() returns [logit_rows.size(), n_vocab] float32, row-major, in this order.
  std::vector<int32_t> logit_rows;
  // block_tables[s]: pool blocks of sequence s, covering at least positions [0, max position of s].
  std::vector<std::vector<int32_t>> block_tables;

  int64_t n_rows() const { return static_cast<int64_t>(tokens.size()); }
};

}  // namespace mk
