// Greedy decoding where the logits are: the program's `argmax` op (graph output "greedy") and
// Backend::forward_greedy. On every backend (reference, cpu, cuda-emu) the op's row must equal the
// host's argmax (greedy_row, i.e. runtime/sampler.h's argmax and check_finite_logits) of the logits
// the same backend returns for the same step: for stories260K's reference_greedy.json cases token for
// token, for a ragged batch of four sequences, and for hand-made rows with ties, NaN, +-inf and all-NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "archs/arch.h"
#include "backend/backend.h"
#include "ir/graph.h"
#include "model/model_file.h"
#include "support/op_rows.h"
#include "support/ragged.h"

namespace mk {
namespace {

const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/";

BackendOptions opts(const std::string& backend) {
  BackendOptions bo;
  bo.threads = 2;
  return bo;
}

void expect_same(const GreedyRow& got, const GreedyRow& want, const std::string& where) {
  EXPECT_EQ(got.id, want.id) << where;
  EXPECT_EQ(got.n_nonfinite, want.n_nonfinite) << where;
  EXPECT_EQ(got.first_nonfinite, want.first_nonfinite) << where;
  EXPECT_EQ(std::bit_cast<uint32_t>(got.first_value), std::bit_cast<uint32_t>(want.first_value)) << where;
}

class E2EGreedy : public ::testing::TestWithParam<std::string> {};

// Each reference_greedy.json case (llama2.c's run.c, greedy) decoded with forward_greedy only; a
// second backend fed the same tokens returns logits whose host argmax must name the same token.
TEST_P(E2EGreedy, StoriesDeviceArgmaxEqualsHostArgmaxAndRunC) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  BuildOptions o;
  o.n_ctx = 320;
  Graph g = build_graph(m, o);
  const int64_t n_vocab = read_hparams(m).n_vocab;
  auto ids = make_backend(GetParam(), g, m, opts(GetParam()));
  auto lg = make_backend(GetParam(), g, m, opts(GetParam()));
  std::ifstream f(kStories + "reference_greedy.json");
  ASSERT_TRUE(f.good());
  const auto cases = nlohmann::json::parse(f);
  ASSERT_EQ(cases.size(), 2u);
  for (const auto& c : cases) {
    ids->reset();
    lg->reset();
    std::vector<int32_t> t = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["generated_ids"].get<std::vector<int32_t>>();
    // The cuda-emu backend decodes the first 40 tokens (about 2 s); the others every token.
    const size_t n = GetParam() == "cuda-emu" ? std::min<size_t>(40, want.size()) : want.size();
    std::vector<int32_t> got;
    int64_t n_past = 0;
    std::span<const int32_t> step(t);
    for (size_t i = 0; i < n; ++i) {
      const GreedyRow gr = ids->forward_greedy(step, n_past);
      const std::vector<float> l = lg->forward(step, n_past);
      ASSERT_EQ(static_cast<int64_t>(l.size()), n_vocab);
      expect_same(gr, greedy_row(l), "step " + std::to_string(i));
      EXPECT_EQ(gr.n_nonfinite, 0);
      n_past += static_cast<int64_t>(step.size());
      got.push_back(gr.id);
      t.push_back(gr.id);
      step = std::span<const int32_t>(t).last(1);
    }
    EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + static_cast<long>(n))) << "prompt '" << c["prompt"] << "'";
  }
}

// A ragged batch (decode rows and prefill chunks of four sequences over scattered KV blocks): every
// wanted row's device choice equals the host argmax of the logits forward(batch) gives for it.
TEST_P(E2EGreedy, RaggedBatchDeviceArgmaxEqualsHostArgmax) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  BuildOptions o;
  o.n_ctx = 64;
  o.kv_pool_tokens = 160;
  o.kv_block_size = 4;
  Graph g = build_graph(m, o);
  const int64_t n_vocab = read_hparams(m).n_vocab;
  auto ids = make_backend(GetParam(), g, m, opts(GetParam()));
  auto lg = make_backend(GetParam(), g, m, opts(GetParam()));
  const auto& steps = test::ragged_steps();  // tests/support/ragged.h
  for (size_t st = 0; st < steps.size(); ++st) {
    const StepBatch b = test::ragged_step(steps[st], n_vocab);
    const std::vector<GreedyRow> got = ids->forward_greedy(b);
    const std::vector<float> l = lg->forward(b);
    ASSERT_EQ(got.size(), b.logit_rows.size());
    ASSERT_EQ(l.size(), b.logit_rows.size() * static_cast<size_t>(n_vocab));
    for (size_t i = 0; i < got.size(); ++i) {
      std::span<const float> row(l.data() + i * static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab));
      expect_same(got[i], greedy_row(row), "step " + std::to_string(st) + " row " + std::to_string(i));
      EXPECT_EQ(got[i].id, std::max_element(row.begin(), row.end()) - row.begin());
    }
  }
}

// The op alone on hand-made rows: a graph embed(table, tokens) -> argmax, so the rows reach the op
// exactly as written. Ties go to the lowest index (also +0 vs -0), NaN never wins wherever it sits,
// an all-NaN row gives -1, infinities count as non-finite (and +inf wins), the first non-finite
// value and its index are reported.
TEST_P(E2EGreedy, OpFollowsTheHostRulesForTiesNanAndInf) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  constexpr int64_t kCols = 40;  // more than one warp's lanes would see in one pass on cuda-emu
  std::vector<std::vector<float>> rows;
  auto row = [&](std::initializer_list<std::pair<int, float>> set, float fill) {
    std::vector<float> r(kCols, fill);
    for (auto [i, v] : set) r[static_cast<size_t>(i)] = v;
    rows.push_back(r);
  };
  row({{5, 2.0f}, {17, 2.0f}, {39, 2.0f}}, 1.0f);             // tie: 5
  row({{0, nan}, {3, 1.0f}}, 0.5f);                           // NaN first: 3, one non-finite at 0
  row({{39, nan}, {12, 7.0f}, {33, 7.0f}}, -1.0f);            // NaN last, tie 12/33
  row({}, nan);                                               // all NaN: -1
  row({{20, inf}, {2, -inf}, {30, inf}}, 0.0f);               // first non-finite 2 (-inf), winner 20
  row({{0, -0.0f}, {1, 0.0f}}, -3.0f);                        // -0 == +0: 0
  row({{38, 9.5f}, {7, nan}, {8, nan}}, -inf);                // many non-finite
  const int64_t n_rows = static_cast<int64_t>(rows.size());
  const std::vector<GreedyRow> got = test::greedy_of_rows(GetParam(), opts(GetParam()), rows);
  ASSERT_EQ(static_cast<int64_t>(got.size()), n_rows);
  const std::vector<int32_t> want_id = {5, 3, 12, -1, 20, 0, 38};
  const std::vector<int32_t> want_bad = {0, 1, 1, kCols, 3, 0, kCols - 1};
  const std::vector<int32_t> want_first = {-1, 0, 39, 0, 2, -1, 0};
  for (int64_t r = 0; r < n_rows; ++r) {
    const std::string where = "row " + std::to_string(r);
    expect_same(got[static_cast<size_t>(r)], greedy_row(rows[static_cast<size_t>(r)]), where);
    EXPECT_EQ(got[static_cast<size_t>(r)].id, want_id[static_cast<size_t>(r)]) << where;
    EXPECT_EQ(got[static_cast<size_t>(r)].n_nonfinite, want_bad[static_cast<size_t>(r)]) << where;
    EXPECT_EQ(got[static_cast<size_t>(r)].first_nonfinite, want_first[static_cast<size_t>(r)]) << where;
  }
  EXPECT_TRUE(std::isnan(got[1].first_value));
  EXPECT_EQ(got[4].first_value, -inf);
}

// Backend::decode_greedy on a chain: token r's logits are row r of a table whose largest value sits
// at next(r), so each step's input is the previous step's choice and the ids show whether the
// handoff happened (on cuda-emu on the device: the id copied from one step's argmax row to the next
// step's token input, 8 steps issued before the wait). Row 7 is all NaN: its row ends the rows (id
// -1; on cuda-emu the step after it stops on token -1, and that error is not the caller's).
TEST_P(E2EGreedy, DecodeGreedyFollowsTheChosenTokens) {
  constexpr int kV = 24;
  auto next = [](int r) { return (r * 5 + 3) % kV; };
  std::vector<std::vector<float>> rows(kV, std::vector<float>(kV, 0.0f));
  for (int r = 0; r < kV; ++r) rows[static_cast<size_t>(r)][static_cast<size_t>(next(r))] = 1.0f + 0.01f * static_cast<float>(r);
  rows[7].assign(kV, std::numeric_limits<float>::quiet_NaN());
  const test::OpRowsModel om =
      test::op_rows_model(rows, "greedy", [](Graph& g, int x) { return g.add(Op::argmax, {x}, {}, "greedy"); });
  auto b = make_backend(GetParam(), om.graph, om.model, opts(GetParam()));
  EXPECT_EQ(b->decode_steps(), GetParam() == "cuda-emu" ? 8 : 1);
  // 1 -> 8 -> 19 -> 2 -> 13 -> 20 -> 7 -> (NaN row)
  const std::vector<int32_t> chain = {8, 19, 2, 13, 20, 7};
  std::vector<GreedyRow> got = b->decode_greedy(1, 0, 5);
  ASSERT_EQ(got.size(), 5u);
  for (size_t j = 0; j < got.size(); ++j) {
    EXPECT_EQ(got[j].id, chain[j]) << "step " << j;
    EXPECT_EQ(got[j].n_nonfinite, 0) << "step " << j;
  }
  got = b->decode_greedy(13, 5, 12);  // 13 -> 20 -> 7 -> the NaN row: three rows, the last non-finite
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].id, 20);
  EXPECT_EQ(got[1].id, 7);
  EXPECT_EQ(got[1].n_nonfinite, 0);
  EXPECT_EQ(got[2].id, -1);
  EXPECT_EQ(got[2].n_nonfinite, kV);
  EXPECT_EQ(got[2].first_nonfinite, 0);
  // cuda-emu ran the step after the NaN row on token -1: stopped until reset, then as new.
  EXPECT_EQ(b->stopped(), GetParam() == "cuda-emu");
  b->reset();
  got = b->decode_greedy(2, 0, 12);  // 2 -> 13 -> 20 -> 7 -> NaN
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[2].id, 7);
  EXPECT_EQ(got[3].id, -1);
  b->reset();
  got = b->decode_greedy(0, 0, 12);  // a loop of 8, and 12 steps: two chunks on cuda-emu
  const std::vector<int32_t> loop = {3, 18, 21, 12, 15, 6, 9, 0, 3, 18, 21, 12};
  ASSERT_EQ(got.size(), loop.size());
  for (size_t j = 0; j < got.size(); ++j) EXPECT_EQ(got[j].id, loop[j]) << "step " << j;
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EGreedy, ::testing::Values("reference", "cpu", "cuda-emu"), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

}  // namespace
}  // namespace mk
