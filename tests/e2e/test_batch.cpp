// Continuous batching inside the program: one step runs a ragged batch (decode rows of several
// sequences plus chunked prefill rows of new ones) over a paged KV pool whose blocks are scattered.
// Every sequence's logits must equal those of the sequence run alone through the one-sequence path
// (forward(tokens, n_past)), on every backend: reference, cpu (dynamic and static-cp schedules, 1
// and 3 workers; 4 attention splits) and cuda-emu (the default; 7 attention splits), for
// stories260K (MHA), an HF Llama fixture with GQA and a tiny Gemma 3 (sliding-window attention,
// tests/data/gemma3). Malformed batches are errors naming the problem.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "support/compare.h"
#include "support/errors.h"

namespace mk {
namespace {

const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
const std::string kLlamaGqa = std::string(MK_SHARED_DIR) + "/fixtures/hf/llama_gqa_float32";

constexpr int64_t kCtx = 64, kBlock = 4, kPool = 160;  // 40 blocks of 4 rows

// One sequence's rows in one step: positions [from, from + n).
struct Chunk {
  int seq;
  int64_t from, n;
};

struct Scenario {
  std::vector<std::vector<int32_t>> tokens;        // per sequence, every token it ever gets
  std::vector<std::vector<int32_t>> blocks;        // per sequence, its pool blocks (scattered)
  std::vector<std::vector<Chunk>> steps;           // the batches, in order
};

// Four sequences over three steps: A is prefilled in two chunks (continues after step 1), B and D
// decode after a short prefill, C arrives in step 2 with a 24-row prefill chunk; step 3 decodes
// all four in a shuffled row order. Blocks come from a shuffled pool, so no sequence is contiguous.
Scenario make_scenario(int64_t n_vocab) {
  Scenario s;
  std::mt19937 rng(1234);
  const std::vector<int64_t> lengths = {21, 7, 25, 5};
  for (int64_t len : lengths) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < len; ++i) t.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(n_vocab)));
    s.tokens.push_back(t);
  }
  std::vector<int32_t> pool(kPool / kBlock);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<int32_t>(i);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  for (int64_t len : lengths) {
    std::vector<int32_t> b;
    for (int64_t p = 0; p < len; p += kBlock) b.push_back(pool[next++]);
    s.blocks.push_back(b);
  }
  s.steps = {
      {{0, 0, 12}, {1, 0, 5}, {3, 0, 3}},
      {{0, 12, 8}, {1, 5, 1}, {2, 0, 24}, {3, 3, 1}},
      {{3, 4, 1}, {2, 24, 1}, {0, 20, 1}, {1, 6, 1}},
  };
  return s;
}

StepBatch to_batch(const Scenario& s, const std::vector<Chunk>& step) {
  StepBatch b;
  b.block_tables = s.blocks;
  for (const Chunk& c : step) {
    for (int64_t i = 0; i < c.n; ++i) {
      b.tokens.push_back(s.tokens[static_cast<size_t>(c.seq)][static_cast<size_t>(c.from + i)]);
      b.positions.push_back(static_cast<int32_t>(c.from + i));
      b.seq.push_back(c.seq);
    }
    b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size()) - 1);
  }
  return b;
}

struct BackendCase {
  std::string name, schedule;
  int threads;
  int attn_splits = -1;  // BackendOptions::attn_splits (-1: the backend's default)
};

// The expected logits: each sequence alone through the one-sequence path, chunked like the steps.
std::map<std::pair<int, int64_t>, std::vector<float>> alone(const Scenario& s, const Graph& g, const ModelFile& m,
                                                             const BackendCase& bc, int64_t n_vocab) {
  BackendOptions bo;
  bo.threads = bc.threads;
  bo.schedule = bc.schedule;
  bo.attn_splits = bc.attn_splits;
  auto b = make_backend(bc.name, g, m, bo);
  std::map<std::pair<int, int64_t>, std::vector<float>> r;  // (sequence, last position) -> logits
  for (size_t q = 0; q < s.tokens.size(); ++q) {
    b->reset();
    for (const auto& step : s.steps)
      for (const Chunk& c : step) {
        if (c.seq != static_cast<int>(q)) continue;
        std::span<const int32_t> t(s.tokens[q].data() + c.from, static_cast<size_t>(c.n));
        auto l = b->forward(t, c.from);
        EXPECT_EQ(static_cast<int64_t>(l.size()), n_vocab);
        r[{c.seq, c.from + c.n - 1}] = l;
      }
  }
  return r;
}

void check_batched(const std::string& path, const BackendCase& bc) {
  ModelFile m = load_model(path);
  BuildOptions o;
  o.n_ctx = kCtx;
  o.kv_pool_tokens = kPool;
  o.kv_block_size = kBlock;
  Graph g = build_graph(m, o);
  const int64_t n_vocab = read_hparams(m).n_vocab;
  Scenario s = make_scenario(n_vocab);
  auto want = alone(s, g, m, bc, n_vocab);
  BackendOptions bo;
  bo.threads = bc.threads;
  bo.schedule = bc.schedule;
  bo.attn_splits = bc.attn_splits;
  auto b = make_backend(bc.name, g, m, bo);
  ASSERT_EQ(b->kv_block_size(), kBlock);
  ASSERT_EQ(b->kv_pool_blocks(), kPool / kBlock);
  ASSERT_GE(b->max_batch_rows(), 34);
  for (size_t st = 0; st < s.steps.size(); ++st) {
    StepBatch batch = to_batch(s, s.steps[st]);
    std::vector<float> got = b->forward(batch);
    ASSERT_EQ(got.size(), s.steps[st].size() * static_cast<size_t>(n_vocab)) << "step " << st;
    for (size_t i = 0; i < s.steps[st].size(); ++i) {
      const Chunk& c = s.steps[st][i];
      std::vector<float> row(got.begin() + static_cast<int64_t>(i) * n_vocab, got.begin() + static_cast<int64_t>(i + 1) * n_vocab);
      const auto& w = want.at({c.seq, c.from + c.n - 1});
      const double err = test::rel_l2(row, w);
      EXPECT_LE(err, 1e-5) << bc.name << " step " << st << " sequence " << c.seq << " position " << c.from + c.n - 1;
      EXPECT_EQ(std::max_element(row.begin(), row.end()) - row.begin(), std::max_element(w.begin(), w.end()) - w.begin());
    }
  }
}

class E2EBatch : public ::testing::TestWithParam<BackendCase> {};

TEST_P(E2EBatch, StoriesRaggedBatchEqualsEachSequenceAlone) { check_batched(kStories, GetParam()); }
TEST_P(E2EBatch, LlamaGqaRaggedBatchEqualsEachSequenceAlone) { check_batched(kLlamaGqa, GetParam()); }
// Gemma 3 with a sliding window of 8 on five of its six layers: sequences of 21 and 25 positions cross it.
TEST_P(E2EBatch, Gemma3SlidingWindowRaggedBatchEqualsEachSequenceAlone) {
  check_batched(std::string(MK_SOURCE_DIR) + "/tests/data/gemma3/gemma3-tiny.f32.gguf", GetParam());
}

// Mixtures of experts: each row its own experts (moe_route per row, moe_matmul per row and slot).
TEST_P(E2EBatch, MoeRaggedBatchEqualsEachSequenceAlone) {
  check_batched(std::string(MK_SOURCE_DIR) + "/tests/data/qwen3moe/qwen3moe-tiny.f32.gguf", GetParam());
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EBatch,
                         ::testing::Values(BackendCase{"reference", "dynamic", 1}, BackendCase{"cpu", "dynamic", 1},
                                           BackendCase{"cpu", "dynamic", 3}, BackendCase{"cpu", "static-cp", 3},
                                           BackendCase{"cuda-emu", "dynamic", 3},
                                           // flash-decoding: rows split over 4 / 7 ranges (prefill rows shorter than that)
                                           BackendCase{"cpu", "static-cp", 3, 4}, BackendCase{"cuda-emu", "dynamic", 3, 7}),
                         [](const auto& info) {
                           std::string n = info.param.name + "_" + info.param.schedule + "_w" + std::to_string(info.param.threads);
                           if (info.param.attn_splits >= 0) n += "_s" + std::to_string(info.param.attn_splits);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// The other decoder shapes (learned positions without RoPE, biases, q/k norms, fused Phi-3 views,
// Gemma's norms) through the same batch on the cpu interpreter.
class E2EBatchFamilies : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EBatchFamilies, RaggedBatchEqualsEachSequenceAlone) {
  check_batched(std::string(MK_SHARED_DIR) + "/fixtures/hf/" + GetParam(), BackendCase{"cpu", "dynamic", 2});
}

INSTANTIATE_TEST_SUITE_P(Hf, E2EBatchFamilies,
                         ::testing::Values("gpt2_float32", "qwen2_bias_float32", "qwen3_qknorm_float32", "gemma_float32",
                                           "phi3_float32", "mistral_float32"),
                         [](const auto& info) { return info.param; });

// A logits row no sequence asks for is not returned; asking for none returns nothing.
TEST(E2EBatchRows, LogitRowsSelectsAndEmptyReturnsNothing) {
  ModelFile m = load_model(kStories);
  BuildOptions o;
  o.n_ctx = kCtx;
  Graph g = build_graph(m, o);
  const int64_t n_vocab = read_hparams(m).n_vocab;
  BackendOptions bo;
  bo.threads = 2;
  auto b = make_backend("cpu", g, m, bo);
  auto ref = make_backend("cpu", g, m, bo);
  std::vector<int32_t> t = {1, 20, 30, 40, 50, 60};
  auto all = ref->forward(std::span<const int32_t>(t.data(), 3), 0);  // logits of position 2
  StepBatch s = one_sequence_batch(std::span<const int32_t>(t.data(), 3), 0, b->kv_block_size(), false);
  s.logit_rows.clear();
  EXPECT_TRUE(b->forward(s).empty());
  s = one_sequence_batch(std::span<const int32_t>(t.data() + 3, 3), 3, b->kv_block_size(), false);
  s.logit_rows = {0, 2};  // positions 3 and 5
  auto got = b->forward(s);
  ASSERT_EQ(static_cast<int64_t>(got.size()), 2 * n_vocab);
  auto p3 = ref->forward(std::span<const int32_t>(t.data() + 3, 1), 3);
  ref->forward(std::span<const int32_t>(t.data() + 4, 1), 4);
  auto p5 = ref->forward(std::span<const int32_t>(t.data() + 5, 1), 5);
  EXPECT_LE(test::rel_l2(std::vector<float>(got.begin(), got.begin() + n_vocab), p3), 1e-6);
  EXPECT_LE(test::rel_l2(std::vector<float>(got.begin() + n_vocab, got.end()), p5), 1e-6);
  (void)all;
}

// A pool smaller than the context: one sequence may fill the pool, not more.
TEST(E2EBatchRows, OneSequenceLongerThanThePoolIsAContextOverflow) {
  ModelFile m = load_model(kStories);
  BuildOptions o;
  o.n_ctx = kCtx;
  o.kv_pool_tokens = 20;  // rounded up to whole blocks: 2 blocks of 16 = 32 rows
  Graph g = build_graph(m, o);
  for (const std::string name : {"reference", "cpu"}) {
    auto b = make_backend(name, g, m, BackendOptions{});
    EXPECT_EQ(b->kv_pool_blocks(), 2) << name;
    std::vector<int32_t> t(33, 5);
    EXPECT_EQ(test::error_of([&] { b->forward(std::span<const int32_t>(t.data(), 32), 0); }), "<no error>") << name;
    EXPECT_EQ(test::error_of([&] { b->forward(std::span<const int32_t>(t.data() + 32, 1), 32); }),
              "context overflow: 32 tokens in the cache + 1 new > the KV pool of 32 rows (kv_pool_tokens)")
        << name;
  }
}

class E2EBatchErrors : public ::testing::TestWithParam<std::string> {};

TEST_P(E2EBatchErrors, MalformedBatchesNameTheProblem) {
  ModelFile m = load_model(kStories);
  BuildOptions o;
  o.n_ctx = kCtx;
  o.kv_pool_tokens = kPool;
  o.kv_block_size = kBlock;
  Graph g = build_graph(m, o);
  BackendOptions bo;
  bo.threads = 2;
  auto b = make_backend(GetParam(), g, m, bo);
  auto good = [] {
    StepBatch s;
    s.tokens = {1, 2, 3, 4};
    s.positions = {0, 1, 0, 0};  // (cuda-emu's race check flags reads of never-written KV rows)
    s.seq = {0, 0, 1, 2};
    s.logit_rows = {1, 2, 3};
    s.block_tables = {{3}, {7}, {9, 2}};
    return s;
  };
  auto err = [&](StepBatch s) { return test::error_of([&] { b->forward(s); }); };
  StepBatch s = good();
  EXPECT_EQ(err(s), "<no error>");
  s = good();
  s.block_tables[2][0] = static_cast<int32_t>(kPool / kBlock);
  EXPECT_NE(err(s).find("sequence 2 block 0 is 40, outside the pool of 40 blocks"), std::string::npos) << err(s);
  s = good();
  s.seq[2] = 3;
  EXPECT_NE(err(s).find("row 2: sequence 3 out of range (block_tables has 3)"), std::string::npos) << err(s);
  s = good();
  s.positions[1] = 2;
  EXPECT_NE(err(s).find("row 1: position 2 does not follow 0"), std::string::npos) << err(s);
  s = good();
  s.seq = {0, 1, 0, 2};
  s.positions = {0, 0, 1, 0};
  EXPECT_NE(err(s).find("row 2: sequence 0 appears again"), std::string::npos) << err(s);
  s = good();
  s.positions[3] = 9;
  EXPECT_NE(err(s).find("sequence 2 has 2 blocks, position 9 needs 3"), std::string::npos) << err(s);
  s = good();
  s.positions[3] = static_cast<int32_t>(kCtx);
  EXPECT_NE(err(s).find("row 3: position 64 outside the context [0, 64)"), std::string::npos) << err(s);
  s = good();
  s.block_tables[1] = {3};  // sequences 0 and 1 both write pool row 12
  EXPECT_NE(err(s).find("rows 0 and 2 write the same KV slot 12"), std::string::npos) << err(s);
  s = good();
  s.logit_rows = {2, 1};
  EXPECT_NE(err(s).find("logit rows must be ascending"), std::string::npos) << err(s);
  s = good();
  s.positions.pop_back();
  EXPECT_NE(err(s).find("4 tokens but 3 positions"), std::string::npos) << err(s);
  s = StepBatch{};
  s.block_tables = {{}};
  const int64_t too_many = b->max_batch_rows() + 1;
  for (int64_t i = 0; i < too_many; ++i) {
    s.tokens.push_back(1);
    s.positions.push_back(static_cast<int32_t>(i % kCtx));
    s.seq.push_back(0);
  }
  EXPECT_NE(err(s).find(fmt::format("{} rows (this program runs 1..{} rows per step)", too_many, too_many - 1)), std::string::npos)
      << err(s);
  s = good();  // sequence 1 decodes at position 2 but only its position 0 was written (block 7 holds one row)
  s.positions = {0, 1, 2, 0};
  EXPECT_NE(err(s).find("internal error: step batch: sequence 1 starts at position 2 but its position 1 (block 0, row 1 "
                        "of pool block 7) was never written"),
            std::string::npos)
      << err(s);
  // The backend still works after rejected batches.
  EXPECT_EQ(err(good()), "<no error>");
}

INSTANTIATE_TEST_SUITE_P(Backends, E2EBatchErrors, ::testing::Values("reference", "cpu", "cuda-emu"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace mk
