// The ragged batches the device-output tests share (greedy ids, top-k candidates): four sequences,
// sequence s on KV blocks 30-4s, 29-4s, 28-4s, 27-4s (descending, so none is contiguous), token i of
// sequence s = (7s + 3i + 1) mod n_vocab; three steps mixing prefill chunks and decode rows, each
// sequence's last row of a step asking for its logits. Needs a program with >= 31 KV blocks of 4.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "backend/step_batch.h"

namespace mk::test {

using RaggedChunk = std::array<int, 3>;  // {seq, first position, rows}

inline StepBatch ragged_step(const std::vector<RaggedChunk>& chunks, int64_t n_vocab) {
  StepBatch b;
  for (int s = 0; s < 4; ++s) b.block_tables.push_back({30 - 4 * s, 29 - 4 * s, 28 - 4 * s, 27 - 4 * s});
  for (const auto& [s, from, n] : chunks) {
    for (int i = from; i < from + n; ++i) {
      b.tokens.push_back((7 * s + 3 * i + 1) % static_cast<int32_t>(n_vocab));
      b.positions.push_back(i);
      b.seq.push_back(s);
    }
    b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size()) - 1);
  }
  return b;
}

inline const std::vector<std::vector<RaggedChunk>>& ragged_steps() {
  static const std::vector<std::vector<RaggedChunk>> steps = {
      {{0, 0, 9}, {1, 0, 3}, {2, 0, 1}},
      {{0, 9, 1}, {1, 3, 5}, {2, 1, 1}, {3, 0, 6}},
      {{3, 6, 1}, {2, 2, 1}, {0, 10, 1}, {1, 8, 1}},
  };
  return steps;
}

}  // namespace mk::test
