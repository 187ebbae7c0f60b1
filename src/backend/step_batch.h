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
#include <algorithm>
#include <cstdint>
#include <span>
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

// Which rows of the KV pool hold what a sequence wrote: per block, how many leading rows have been
// written (a row at position p leaves its block at p % block_size + 1; rows of a sequence come in
// order, so a rewrite of an earlier position truncates). A backend keeps one beside its pool, clears
// it in reset(), and names it in its StepLimits; prepare_step checks each sequence against it and
// records the step's rows. A block handed to another sequence keeps its count until that sequence
// writes it from row 0 (as every sequence does): a scheduler that skipped positions in a reused
// block goes unnoticed.
struct KvWritten {
  std::vector<int32_t> rows;  // [pool blocks]
  void clear() { std::fill(rows.begin(), rows.end(), 0); }
};

// What a backend checks a batch against: rows per step, positions per sequence, the pool.
struct StepLimits {
  int64_t max_rows = 0;            // rows per step (the program's max_tokens)
  int64_t n_ctx = 0;               // positions per sequence; 0 = unbounded (no KV cache)
  int64_t block_size = 0;          // rows per KV block; 0 = the program has no KV cache
  int64_t pool_blocks = 0;         // blocks in the pool
  int64_t max_blocks_per_seq = 0;  // columns of the flat block table: ceil(n_ctx / block_size)
  KvWritten* written = nullptr;    // the pool's written rows, checked and advanced by prepare_step; null = unchecked
};

// The flat i32 inputs a compiled program reads in one step (isa/program.h), from a checked batch.
struct StepInputs {
  std::vector<int32_t> tokens, positions;
  std::vector<int32_t> kv_slot;      // [n_rows] pool row of each row's K/V (empty without a KV cache)
  std::vector<int32_t> row_seq;      // [n_rows] row of block_table holding the row's sequence
  std::vector<int32_t> block_table;  // [n_seqs, max_blocks_per_seq], the sequences in order of first row; 0-padded
  std::vector<int32_t> logit_rows;   // [n_out >= 1]: the batch's logit_rows, or the last row when it lists none
  int64_t n_seqs = 0;
  int64_t n_rows() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_out() const { return static_cast<int64_t>(logit_rows.size()); }
};

// Checks `batch` and flattens it. Throws mk::Error ("step batch: ...") naming the row, sequence or
// block for: no rows or more than max_rows, per-row vectors of different lengths, a sequence index
// outside block_tables, rows of one sequence not consecutive or positions not consecutive, a
// position outside [0, n_ctx), a position past its sequence's blocks, a block outside the pool, two
// rows writing one KV slot, logit_rows not ascending in [0, n_rows). With limits.written: a sequence
// whose first row in the step is at position p while a position before p was never written throws
// "internal error: step batch: ..." (the scheduler lost track of a sequence's cache: attention would
// read rows nobody wrote); a batch that passes every check is recorded there.
StepInputs prepare_step(const StepBatch& batch, const StepLimits& limits);

// The rows forward(StepBatch) and Backend::forward_rows return, from a step's output [rows, cols]
// (float logits, or the i32 words of an OutputKind): rows == n_out (the program gathered logit_rows)
// or rows == n_rows (an all-rows program: picked here). Returns [batch.logit_rows.size(), cols].
std::vector<float> select_logit_rows(std::span<const float> out, int64_t rows, int64_t cols, const StepBatch& batch,
                                     const StepInputs& in);
std::vector<int32_t> select_logit_rows(std::span<const int32_t> out, int64_t rows, int64_t cols, const StepBatch& batch,
                                       const StepInputs& in);

// The i32 rows a step can return in place of logits (Backend::forward_rows): the graph output
// "greedy" (the `argmax` op, GreedyRow, 4 words a row) or "topk" (the `topk` op, TopKRow, 4 + 2k).
enum class OutputKind { greedy, topk };
const char* output_name(OutputKind kind);  // "greedy" | "topk"
// Words in one row of `kind` (k: the topk op's candidates; greedy ignores it).
int64_t output_row_words(OutputKind kind, int64_t k);
// The row the op writes for one logits row: greedy_row or topk_row(logits, k), encoded.
void encode_output_row(OutputKind kind, std::span<const float> logits, int64_t k, int32_t* out);

// The greedy choice of one logits row (the `argmax` op's output row: i32 [id, n_nonfinite,
// first_nonfinite, first_value's bits]). id: index of the largest value, ties to the lowest index,
// NaN never wins, -1 when every value is NaN (runtime/sampler.h's argmax); n_nonfinite: NaN/inf values
// in the row; first_nonfinite / first_value: the first one's index and value, -1 / 0 when none (what
// check_finite_logits reports).
struct GreedyRow {
  int32_t id = -1;
  int32_t n_nonfinite = 0;
  int32_t first_nonfinite = -1;
  float first_value = 0;
};
GreedyRow greedy_row(std::span<const float> logits);
// The same by one scalar pass (the definition), and by AVX-512 (one pass for the maximum and a
// finiteness check, one for the first index holding it; rows with a NaN or an infinity go to the
// scalar pass): the same row for every input (StepBatchGreedy.Avx512EqualsPortable). greedy_row uses
// the AVX-512 one where the CPU has it; greedy_row_avx512 may only be called when
// greedy_row_avx512_available().
GreedyRow greedy_row_portable(std::span<const float> logits);
GreedyRow greedy_row_avx512(std::span<const float> logits);
bool greedy_row_avx512_available();
// The op's encoding of a row (4 words) and back.
void encode_greedy_row(const GreedyRow& g, int32_t* out);
GreedyRow decode_greedy_row(std::span<const int32_t> words);

// The sampler's candidates of one logits row (the `topk` op's output row, i32 [4 + 2k]: n_cand,
// n_nonfinite, first_nonfinite, first_value's bits, then k (id, logit bits) pairs). ids/logits: the
// min(k, non-NaN values) largest non-NaN values in runtime/sampler.h's order (logit descending, ties
// to the lower id, -0 == +0; +-inf are ordered as values); n_nonfinite / first_*: as GreedyRow
// (generation refuses such rows before it samples).
struct TopKRow {
  std::vector<int32_t> ids;
  std::vector<float> logits;
  int32_t n_nonfinite = 0;
  int32_t first_nonfinite = -1;
  float first_value = 0;
};
TopKRow topk_row(std::span<const float> logits, int64_t k);
// The op's encoding of a row (4 + 2k words; unused pairs are (-1, 0)) and back.
void encode_topk_row(const TopKRow& t, int64_t k, int32_t* out);
TopKRow decode_topk_row(std::span<const int32_t> words);

// The one-sequence case: tokens at positions n_past.., block table 0, 1, 2, ... (pool row ==
// position), logits of the last row, or of every row when all_rows.
StepBatch one_sequence_batch(std::span<const int32_t> tokens, int64_t n_past, int64_t block_size, bool all_rows);
// one_sequence_batch checked and flattened; a sequence longer than the pool (kv_pool_tokens < n_ctx)
// is a "context overflow" error naming the pool.
StepInputs one_sequence_step(std::span<const int32_t> tokens, int64_t n_past, const StepLimits& limits, bool all_rows);

}  // namespace mk
