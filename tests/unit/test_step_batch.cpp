// prepare_step's record of written KV rows (backend/step_batch.h KvWritten): a batch that would
// attend to positions nobody wrote is refused, naming the sequence and the first missing position;
// and greedy_row's AVX-512 pass against the scalar definition.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/step_batch.h"
#include "support/errors.h"

namespace mk {
namespace {

// A pool of 8 blocks of 4 rows, contexts of 16 positions.
StepLimits limits(KvWritten* w) {
  StepLimits l;
  l.max_rows = 16;
  l.n_ctx = 16;
  l.block_size = 4;
  l.pool_blocks = 8;
  l.max_blocks_per_seq = 4;
  l.written = w;
  return l;
}

// One sequence's rows at positions [from, from + n) over `blocks`.
StepBatch rows(int32_t from, int32_t n, std::vector<int32_t> blocks) {
  StepBatch b;
  for (int32_t i = 0; i < n; ++i) {
    b.tokens.push_back(1);
    b.positions.push_back(from + i);
    b.seq.push_back(0);
  }
  b.block_tables = {std::move(blocks)};
  return b;
}

std::string err(const StepBatch& b, const StepLimits& l) { return test::error_of([&] { prepare_step(b, l); }); }

TEST(StepBatchWritten, RowsAfterTheirPrefixPass) {
  KvWritten w;
  const StepLimits l = limits(&w);
  EXPECT_EQ(err(rows(0, 6, {5, 2}), l), "<no error>");  // prefill 0..5: block 5 full, block 2 holds 2 rows
  EXPECT_EQ(w.rows, (std::vector<int32_t>{0, 0, 2, 0, 0, 4, 0, 0}));
  EXPECT_EQ(err(rows(6, 1, {5, 2}), l), "<no error>");  // decode at n_past = 6
  EXPECT_EQ(err(rows(7, 2, {5, 2, 6}), l), "<no error>");  // across a block boundary
  EXPECT_EQ(w.rows, (std::vector<int32_t>{0, 0, 4, 0, 0, 4, 1, 0}));
  // Rewriting an earlier position (a rewind) is allowed and truncates what its block holds.
  EXPECT_EQ(err(rows(5, 1, {5, 2}), l), "<no error>");
  EXPECT_EQ(w.rows[2], 2);
  EXPECT_NE(err(rows(7, 1, {5, 2}), l).find("position 6 (block 1, row 2 of pool block 2) was never written"),
            std::string::npos);
}

TEST(StepBatchWritten, NeverWrittenPositionsAreRefused) {
  KvWritten w;
  const StepLimits l = limits(&w);
  // A fresh pool: a row at n_past = 3 whose positions 0..2 nobody wrote.
  EXPECT_EQ(err(rows(3, 1, {4}), l),
            "internal error: step batch: sequence 0 starts at position 3 but its position 0 (block 0, row 0 of pool "
            "block 4) was never written; the scheduler lost track of its KV cache");
  EXPECT_EQ(w.rows, std::vector<int32_t>(8, 0)) << "a refused batch records nothing";
  // Written 0..3 in block 4, then a row at 9 through a block table whose block 1 (pool block 3) is empty.
  ASSERT_EQ(err(rows(0, 4, {4}), l), "<no error>");
  EXPECT_NE(err(rows(9, 1, {4, 3, 1}), l).find("sequence 0 starts at position 9 but its position 4 (block 1, row 0 of pool block 3)"),
            std::string::npos);
  // Two sequences in one batch: the second one skips a position of its own block.
  StepBatch b = rows(4, 1, {4, 3});
  b.tokens.push_back(1);
  b.positions.push_back(2);
  b.seq.push_back(1);
  b.block_tables.push_back({0});
  EXPECT_NE(err(b, l).find("sequence 1 starts at position 2 but its position 0 (block 0, row 0 of pool block 0)"),
            std::string::npos)
      << err(b, l);
  // reset() clears the record: a fresh start at 0 is fine, a continuation is not.
  w.clear();
  EXPECT_NE(err(rows(4, 1, {4, 3}), l).find("its position 0"), std::string::npos);
  EXPECT_EQ(err(rows(0, 1, {4}), l), "<no error>");
}

// Without a record (limits.written null) nothing is tracked: the old contract.
TEST(StepBatchWritten, NoRecordNoCheck) { EXPECT_EQ(err(rows(3, 1, {4}), limits(nullptr)), "<no error>"); }

// greedy_row's AVX-512 pass gives the scalar definition's row for every input: lengths around the
// 16-lane width, ties (the lowest index wins, -0 == +0), the maximum first / last / in a tail, NaN,
// +-inf (counted, first reported; NaN never wins), all NaN, the empty row, a vocabulary-sized row.
TEST(StepBatchGreedy, Avx512EqualsPortable) {
  if (!greedy_row_avx512_available()) GTEST_SKIP() << "this CPU has no AVX-512";
  std::mt19937 rng(5);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  int checked = 0;
  const auto same = [&](const std::vector<float>& row, const std::string& what) {
    const GreedyRow a = greedy_row_portable(row), b = greedy_row_avx512(row), c = greedy_row(row);
    for (const GreedyRow* g : {&b, &c}) {
      EXPECT_EQ(g->id, a.id) << what;
      EXPECT_EQ(g->n_nonfinite, a.n_nonfinite) << what;
      EXPECT_EQ(g->first_nonfinite, a.first_nonfinite) << what;
      EXPECT_EQ(std::bit_cast<uint32_t>(g->first_value), std::bit_cast<uint32_t>(a.first_value)) << what;
    }
    ++checked;
  };
  same({}, "empty");
  for (const int n : {1, 2, 15, 16, 17, 31, 32, 33, 47, 100, 49152}) {
    for (int trial = 0; trial < 24; ++trial) {
      std::vector<float> row(static_cast<size_t>(n));
      // few distinct values: ties are common
      std::uniform_int_distribution<int> small(-3, 3);
      std::normal_distribution<float> nd(0.0f, 5.0f);
      for (auto& v : row) v = trial % 2 ? static_cast<float>(small(rng)) : nd(rng);
      std::uniform_int_distribution<int> pos(0, n - 1);
      const std::string what = "n " + std::to_string(n) + " trial " + std::to_string(trial);
      switch (trial % 8) {
        case 2: row[static_cast<size_t>(pos(rng))] = nan; break;
        case 3: row[static_cast<size_t>(pos(rng))] = inf; break;
        case 4: row[static_cast<size_t>(pos(rng))] = -inf; break;
        case 5:
          for (auto& v : row) v = v > 0 ? 0.0f : -0.0f;  // only zeros: the first one wins
          break;
        case 6: row.back() = 1e30f; break;   // the maximum in the tail
        case 7: row.front() = 1e30f; break;  // the maximum first
        default: break;
      }
      same(row, what);
    }
    std::vector<float> all_nan(static_cast<size_t>(n), nan);
    same(all_nan, "all NaN, n " + std::to_string(n));
    all_nan[static_cast<size_t>(n - 1)] = -1.0f;
    same(all_nan, "NaN but the last, n " + std::to_string(n));
  }
  EXPECT_GT(checked, 250);
}

}  // namespace
}  // namespace mk
