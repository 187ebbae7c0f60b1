// Top-k sampling where the logits are: the program's `topk` op (graph output "topk"),
// Backend::forward_topk and Sampler::sample_top. On every backend (reference, cpu, cuda-emu) the op's
// rows must equal an independent host sort of the row (value descending, ties to the lower index,
// -0 == +0, NaN left out) for hand-made rows (ties across the cut, signed zeros, NaN/inf, all-NaN,
// rows shorter than k, rows that overflow the device's candidate buffer), and the
// candidates of forward(batch)'s logits for stories260K's ragged batches; and sampled decoding
// (temperature 0.8, top-k 40, several seeds) must give the tokens the full-logits path gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "archs/arch.h"
#include "backend/backend.h"
#include "ir/graph.h"
#include "ir/topk.h"
#include "model/model_file.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "support/cli.h"
#include "support/op_rows.h"
#include "support/ragged.h"
#include "support/error.h"

namespace mk {
namespace {

const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/";

BackendOptions opts() {
  BackendOptions bo;
  bo.threads = 2;
  return bo;
}

// The oracle: every non-NaN index sorted by (value desc, index asc), the first k kept.
TopKRow host_sort(const std::vector<float>& row, int64_t k) {
  TopKRow t;
  std::vector<int32_t> idx;
  for (size_t i = 0; i < row.size(); ++i) {
    if (!std::isfinite(row[i]) && t.n_nonfinite++ == 0) {
      t.first_nonfinite = static_cast<int32_t>(i);
      t.first_value = row[i];
    }
    if (!std::isnan(row[i])) idx.push_back(static_cast<int32_t>(i));
  }
  std::sort(idx.begin(), idx.end(),
            [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  for (size_t j = 0; j < idx.size() && static_cast<int64_t>(j) < k; ++j) {
    t.ids.push_back(idx[j]);
    t.logits.push_back(row[static_cast<size_t>(idx[j])]);
  }
  return t;
}

void expect_same(const TopKRow& got, const TopKRow& want, const std::string& where) {
  EXPECT_EQ(got.ids, want.ids) << where;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << where;
  for (size_t i = 0; i < got.logits.size(); ++i)  // bit for bit: -0 stays -0
    EXPECT_EQ(std::bit_cast<uint32_t>(got.logits[i]), std::bit_cast<uint32_t>(want.logits[i]))
        << where << " candidate " << i;
  EXPECT_EQ(got.n_nonfinite, want.n_nonfinite) << where;
  EXPECT_EQ(got.first_nonfinite, want.first_nonfinite) << where;
  EXPECT_EQ(std::bit_cast<uint32_t>(got.first_value), std::bit_cast<uint32_t>(want.first_value)) << where;
}

// `draws` samples of `s` on `row` against the probabilities `want` (0: must never be drawn): how
// many draws fell on a token outside `want`, and how many tokens' counts lie more than 5 standard
// deviations (+1) from their binomial mean.
struct DrawCheck {
  int outside = 0, off = 0;
  std::vector<int> got;  // draws per token
};
DrawCheck draw_and_compare(Sampler& s, const std::vector<float>& row, const std::vector<double>& want, int draws) {
  DrawCheck c;
  c.got.assign(row.size(), 0);
  for (int d = 0; d < draws; ++d) ++c.got[static_cast<size_t>(s.sample(row))];
  for (size_t i = 0; i < row.size(); ++i) {
    if (want[i] == 0) {
      c.outside += c.got[i];
      continue;
    }
    const double mean = draws * want[i], sd = std::sqrt(draws * want[i] * (1 - want[i]));
    if (std::abs(c.got[i] - mean) > 5 * sd + 1) ++c.off;
  }
  return c;
}

class E2ETopK : public ::testing::TestWithParam<std::string> {};

// Short rows (40 values, fewer than k = 64): every non-NaN value comes back, sorted; the header
// counts the non-finite values.
TEST_P(E2ETopK, OpOnShortRowsReturnsEveryValueSorted) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  constexpr int kCols = 40;
  std::vector<std::vector<float>> rows;
  auto row = [&](std::initializer_list<std::pair<int, float>> set, float fill) {
    std::vector<float> r(kCols, fill);
    for (auto [i, v] : set) r[static_cast<size_t>(i)] = v;
    rows.push_back(r);
  };
  row({{5, 2.0f}, {17, 2.0f}, {39, 2.0f}, {3, -1.0f}}, 1.0f);  // ties everywhere
  row({{0, nan}, {3, 1.0f}, {9, nan}}, 0.5f);                  // NaN left out: 38 candidates
  row({}, nan);                                                // all NaN: none
  row({{20, inf}, {2, -inf}, {30, inf}}, 0.0f);                // +-inf ordered as values
  row({{0, -0.0f}, {1, 0.0f}, {2, -0.0f}}, -3.0f);             // -0 == +0: by index
  std::vector<float> ramp(kCols);
  for (int i = 0; i < kCols; ++i) ramp[static_cast<size_t>(i)] = static_cast<float>((i * 17) % 23) - 11.0f;
  rows.push_back(ramp);
  const auto got = test::topk_of_rows(GetParam(), opts(), rows, kTopK);
  ASSERT_EQ(got.size(), rows.size());
  for (size_t r = 0; r < rows.size(); ++r) expect_same(got[r], host_sort(rows[r], kTopK), "row " + std::to_string(r));
  EXPECT_EQ(got[0].ids.size(), 40u);
  EXPECT_EQ(got[1].ids.size(), 38u);
  EXPECT_EQ(got[1].n_nonfinite, 2);
  EXPECT_TRUE(got[2].ids.empty());
  EXPECT_EQ(got[2].n_nonfinite, kCols);
  EXPECT_EQ(got[3].ids[0], 20);
  EXPECT_EQ(got[3].ids[1], 30);
  EXPECT_EQ(got[3].ids.back(), 2);
  EXPECT_EQ(got[3].first_value, -inf);
  EXPECT_EQ(std::vector<int32_t>(got[4].ids.begin(), got[4].ids.begin() + 3), (std::vector<int32_t>{0, 1, 2}));
}

// Long rows (3000 values, k = 64 and k = 5): random logits, ties straddling the cut, signed zeros,
// many equal values, mostly NaN, -inf filled.
TEST_P(E2ETopK, OpOnLongRowsEqualsAHostSort) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  constexpr int kCols = 3000;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<std::vector<float>> rows;
  std::vector<float> r(kCols);
  for (auto& v : r) v = normal(rng);  // logits-like
  rows.push_back(r);
  for (int i = 0; i < kCols; ++i)
    r[static_cast<size_t>(i)] = static_cast<float>((i * 7919) % 13);  // 231 values tie at the top
  rows.push_back(r);
  std::fill(r.begin(), r.end(), 1.5f);  // all equal: the lowest 64 indices
  rows.push_back(r);
  for (int i = 0; i < kCols; ++i) r[static_cast<size_t>(i)] = (i % 3 == 0) ? -0.0f : (i % 3 == 1 ? 0.0f : -1.0f);
  for (int i = 0; i < 20; ++i)
    r[static_cast<size_t>(150 * i + 7)] = 1.0f + static_cast<float>(i);  // 20 above the zeros
  rows.push_back(r);
  for (int i = 0; i < kCols; ++i)
    r[static_cast<size_t>(i)] = i < 1800 ? 4.0f : normal(rng);  // 1800 ties above the rest
  for (int i = 0; i < 30; ++i) r[static_cast<size_t>(97 * i + 5)] = 10.0f + static_cast<float>(i % 7);  // 30 above them
  rows.push_back(r);
  std::fill(r.begin(), r.end(), nan);  // mostly NaN: 40 values
  for (int i = 0; i < 40; ++i) r[static_cast<size_t>(71 * i + 3)] = normal(rng);
  rows.push_back(r);
  std::fill(r.begin(), r.end(), -inf);  // -inf filled, a few finite and +inf
  r[2999] = 3.0f;
  r[1000] = inf;
  r[17] = -2.0f;
  rows.push_back(r);
  for (int64_t k : {kTopK, int64_t{5}}) {
    const auto got = test::topk_of_rows(GetParam(), opts(), rows, k);
    ASSERT_EQ(got.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      expect_same(got[i], host_sort(rows[i], k), "k " + std::to_string(k) + " row " + std::to_string(i));
  }
}

// Rows whose best values sit in few threads' strided slices (indices j % 512 < 48: 48 threads for
// 128, 256 or 512 threads per block), so that more values than the device's candidate buffer (1024)
// pass the cut and the exact radix select decides: by value alone (distinct values), and by value
// then index (few distinct values: equal values straddle the k-th place).
TEST_P(E2ETopK, OpWhenTheBestValuesShareFewThreadsEqualsAHostSort) {
  constexpr int kCols = 12000;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> rows(3, std::vector<float>(kCols));
  for (int j = 0; j < kCols; ++j) {
    const bool big = j % 512 < 48;  // 1125 values
    rows[0][static_cast<size_t>(j)] = big ? 100.0f + normal(rng) : normal(rng);
    rows[1][static_cast<size_t>(j)] = big ? 100.0f + static_cast<float>(j % 3) : normal(rng);
    rows[2][static_cast<size_t>(j)] = big ? 50.0f : normal(rng);
  }
  // cuda-emu: k = 64 only (each radix pass is about 1.5 s of emulated atomics on a loaded machine).
  for (int64_t k : GetParam() == "cuda-emu" ? std::vector<int64_t>{kTopK} : std::vector<int64_t>{kTopK, 5}) {
    const auto got = test::topk_of_rows(GetParam(), opts(), rows, k);
    ASSERT_EQ(got.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      expect_same(got[i], host_sort(rows[i], k), "k " + std::to_string(k) + " row " + std::to_string(i));
  }
}

// A ragged batch of four sequences over scattered KV blocks (stories260K, 512 tokens): every wanted
// row's candidates equal the host's of the logits forward(batch) gives for it.
TEST_P(E2ETopK, RaggedBatchCandidatesEqualTheLogitsRows) {
  ModelFile m = load_model(kStories + "stories260K.gguf");
  BuildOptions o;
  o.n_ctx = 64;
  o.kv_pool_tokens = 160;
  o.kv_block_size = 4;
  Graph g = build_graph(m, o);
  const int64_t n_vocab = read_hparams(m).n_vocab;
  auto top = make_backend(GetParam(), g, m, opts());
  auto lg = make_backend(GetParam(), g, m, opts());
  // `mixed` alternates candidates, logits only (the cpu and CUDA backends skip the topk op's
  // selection then), candidates: the last step's candidates must not be the skipped step's leftovers.
  auto mixed = make_backend(GetParam(), g, m, opts());
  const auto& steps = test::ragged_steps();  // tests/support/ragged.h
  for (size_t st = 0; st < steps.size(); ++st) {
    const StepBatch b = test::ragged_step(steps[st], n_vocab);
    const std::vector<TopKRow> got = top->forward_topk(b);
    const std::vector<float> l = lg->forward(b);
    if (st == 1) {
      EXPECT_EQ(mixed->forward(b), l) << "step " << st;
    } else {
      const std::vector<TopKRow> alt = mixed->forward_topk(b);
      ASSERT_EQ(alt.size(), got.size());
      for (size_t i = 0; i < got.size(); ++i) expect_same(alt[i], got[i], "mixed step " + std::to_string(st));
    }
    ASSERT_EQ(got.size(), b.logit_rows.size());
    ASSERT_EQ(l.size(), b.logit_rows.size() * static_cast<size_t>(n_vocab));
    for (size_t i = 0; i < got.size(); ++i) {
      std::vector<float> row(l.begin() + static_cast<long>(i) * n_vocab,
                             l.begin() + static_cast<long>(i + 1) * n_vocab);
      expect_same(got[i], host_sort(row, kTopK), "step " + std::to_string(st) + " row " + std::to_string(i));
      EXPECT_EQ(static_cast<int64_t>(got[i].ids.size()), kTopK);
    }
  }
}

// Sampled decoding (temperature 0.8, top-k 40, top-p 0.95, several seeds): `generate` (which asks
// the backend for candidates) gives the tokens of the full-logits path (forward + Sampler::sample
// on the whole row, what generate did before), on stories260K.
TEST_P(E2ETopK, SampledGenerationEqualsTheFullLogitsPath) {
  SessionOptions so;
  so.model_path = kStories + "stories260K.bin";
  so.backend = GetParam();
  so.backend_options.threads = 2;
  so.n_ctx = 128;
  Session s(so);
  const int n_new = GetParam() == "cuda-emu" ? 24 : 60;
  for (uint64_t seed : {1u, 7u, 42u}) {
    SamplerOptions so8{0.8f, 40, 0.95f, seed};
    GenerateOptions go;
    go.prompt = "Once upon a time";
    go.n_new = n_new;
    go.ignore_eos = true;
    go.sampler = so8;
    s.reset();
    const GenerateResult r = generate(s, go);
    // The full-logits path by hand.
    s.reset();
    Sampler sampler(so8);
    std::vector<int32_t> want;
    std::vector<float> l = s.eval(r.prompt_ids);
    for (int i = 0; i < n_new; ++i) {
      const int32_t next = sampler.sample(std::span<const float>(l).last(static_cast<size_t>(s.hparams.n_vocab)));
      want.push_back(next);
      if (i + 1 < n_new) l = s.eval(std::span<const int32_t>(&next, 1));
    }
    EXPECT_EQ(r.generated_ids, want) << "seed " << seed;
    EXPECT_EQ(static_cast<int>(r.generated_ids.size()), n_new);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, E2ETopK, ::testing::Values("reference", "cpu", "cuda-emu"), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

// `run --temp 0.8 --top-k 40 --seed S` (the CLI's sampled path, candidates from the backend) prints
// the tokens of the full-logits path, on cpu.
TEST(E2ETopKCli, RunSampledTopKEqualsTheFullLogitsPath) {
  SessionOptions so;
  so.model_path = kStories + "stories260K.bin";
  so.backend = "cpu";
  so.backend_options.threads = 2;
  Session s(so);
  for (uint64_t seed : {3u, 11u}) {
    int status = 0;
    std::string err;
    const std::string out =
        mk::test::run_cli("run --json --backend cpu -t 2 --temp 0.8 --top-k 40 --seed " + std::to_string(seed) +
                              " -n 40 --ignore-eos -m " + kStories + "stories260K.bin -p 'The cat sat'",
                          &status, &err);
    ASSERT_EQ(status, 0) << err;
    const auto j = nlohmann::json::parse(out);
    const auto prompt = j["prompt_ids"].get<std::vector<int32_t>>();
    s.reset();
    Sampler sampler({0.8f, 40, 0.95f, seed});
    std::vector<int32_t> want;
    std::vector<float> l = s.eval(prompt);
    for (int i = 0; i < 40; ++i) {
      const int32_t next = sampler.sample(l);
      want.push_back(next);
      if (i + 1 < 40) l = s.eval(std::span<const int32_t>(&next, 1));
    }
    EXPECT_EQ(j["generated_ids"].get<std::vector<int32_t>>(), want) << "seed " << seed;
  }
}

// Sampler::sample_top on a row's candidates draws the token sample() draws from the whole row, for
// every top_k in [1, kTopK], several temperatures / top_p / seeds, rows with ties and a vocabulary
// smaller than k; top_k = 0 and top_k > the candidates are not covered.
TEST(TopKSampler, SampleTopEqualsSampleOnTheFullRow) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t n_vocab : {512, 50, 7}) {
    std::vector<float> row(static_cast<size_t>(n_vocab));
    for (int trial = 0; trial < 3; ++trial) {
      for (auto& v : row) v = trial == 2 ? std::round(normal(rng)) : normal(rng);  // trial 2: many ties
      const TopKRow c = topk_row(row, kTopK);
      for (int top_k = 1; top_k <= kTopK; top_k += (top_k < 8 ? 1 : 7)) {
        for (float temp : {0.0f, 0.5f, 1.3f})
          for (float top_p : {1.0f, 0.9f}) {
            const SamplerOptions so{temp, top_k, top_p, static_cast<uint64_t>(100 + top_k + trial)};
            Sampler full(so), top(so);
            ASSERT_TRUE(top.covered_by(static_cast<int64_t>(c.ids.size()), n_vocab));
            for (int draw = 0; draw < 5; ++draw)  // the same stream of draws
              EXPECT_EQ(top.sample_top(c.ids, c.logits, n_vocab), full.sample(row))
                  << "vocab " << n_vocab << " trial " << trial << " top_k " << top_k << " temp " << temp << " top_p "
                  << top_p;
          }
      }
    }
  }
  // top_k 0 (no cut) over a vocabulary within the candidates: sample_top gives sample()'s tokens too.
  for (int64_t n_vocab : {50, 7})
    for (float top_p : {1.0f, 0.9f, 0.3f}) {
      std::vector<float> row(static_cast<size_t>(n_vocab));
      for (auto& v : row) v = std::round(normal(rng));  // ties
      const TopKRow c = topk_row(row, kTopK);
      Sampler full({1.1f, 0, top_p, 9}), top({1.1f, 0, top_p, 9});
      ASSERT_TRUE(top.covered_by(static_cast<int64_t>(c.ids.size()), n_vocab));
      for (int draw = 0; draw < 40; ++draw)
        EXPECT_EQ(top.sample_top(c.ids, c.logits, n_vocab), full.sample(row)) << n_vocab << " " << top_p;
    }
  Sampler off({0.8f, 0, 1.0f, 1});
  EXPECT_FALSE(off.covered_by(kTopK, 512));
  EXPECT_TRUE(off.covered_by(kTopK, kTopK));  // the whole vocabulary is in the candidates
  Sampler big({0.8f, static_cast<int>(kTopK) + 1, 1.0f, 1});
  EXPECT_FALSE(big.covered_by(kTopK, 512));
  std::vector<int32_t> ids = {1, 2};
  std::vector<float> lg = {1.0f, 0.5f};
  EXPECT_THROW(big.sample_top(ids, lg, 512), Error);
}

// Sampling without a top-k cut (the server's default: top_k 0) draws each token with its softmax
// probability, and with top_p < 1 only from the nucleus: the fewest best tokens whose probability
// reaches top_p, ties to the lower id. 30000 draws on a 1000-token row (a peaked head, a long flat
// tail, ties across the nucleus edge) against probabilities computed here with a full sort; every
// token's count within 5 standard deviations, and no token outside the nucleus drawn.
TEST(Sampler, WithoutTopKDrawsTheSoftmaxOfTheNucleus) {
  const size_t n = 1000;
  std::vector<float> row(n);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) row[i] = i % 97 == 5 ? 4.0f + 0.25f * static_cast<float>(i % 5) : normal(rng);
  for (float temp : {1.0f, 0.6f})
    for (float top_p : {1.0f, 0.9f, 0.5f}) {
      const std::vector<int32_t> order = host_sort(row, static_cast<int64_t>(n)).ids;
      std::vector<double> p(n);
      double sum = 0;
      for (size_t i = 0; i < n; ++i) sum += (p[i] = std::exp((row[i] - row[order[0]]) / temp));
      std::vector<double> want(n, 0.0);
      double cum = 0, kept = 0;
      for (int32_t id : order) {
        want[id] = p[id];
        kept += p[id];
        if ((cum += p[id] / sum) >= top_p) break;
      }
      for (auto& x : want) x /= kept;
      Sampler s({temp, 0, top_p, 77});
      const DrawCheck c = draw_and_compare(s, row, want, 30000);
      EXPECT_EQ(c.outside, 0) << "temp " << temp << " top_p " << top_p;
      EXPECT_EQ(c.off, 0) << "temp " << temp << " top_p " << top_p;
    }
}


// min-p keeps the tokens whose probability (after temperature) is at least min_p x the best one's,
// the draw over them in proportion (Hugging Face's MinPLogitsWarper after top-k and top-p). Both
// sampling paths (top_k 0: the whole row; top_k 40: the sorted candidates), 20000 draws each, against
// probabilities computed here; sample_top on the candidates equals sample on the row.
TEST(Sampler, MinPDrawsOnlyTokensNearTheBest) {
  const size_t n = 300;
  std::vector<float> row(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (auto& v : row) v = normal(rng);
  for (float temp : {1.0f, 0.7f})
    for (float min_p : {0.05f, 0.3f, 1.0f})
      for (int top_k : {0, 40}) {
        const std::vector<int32_t> order = host_sort(row, static_cast<int64_t>(n)).ids;
        std::vector<double> want(n, 0.0);
        double kept = 0;
        for (size_t r = 0; r < (top_k ? static_cast<size_t>(top_k) : n); ++r) {
          const double w = std::exp((row[order[r]] - row[order[0]]) / temp);  // relative to the best (1)
          if (w >= min_p) kept += (want[order[r]] = w);
        }
        for (auto& x : want) x /= kept;
        SamplerOptions so{temp, top_k, 1.0f, 31};
        so.min_p = min_p;
        Sampler s(so);
        const int draws = 20000;
        const DrawCheck c = draw_and_compare(s, row, want, draws);
        EXPECT_EQ(c.outside, 0) << "temp " << temp << " min_p " << min_p << " top_k " << top_k;
        EXPECT_EQ(c.off, 0) << "temp " << temp << " min_p " << min_p << " top_k " << top_k;
        if (min_p == 1.0f) {
          EXPECT_EQ(c.got[static_cast<size_t>(order[0])], draws);  // only the best
        }
        if (top_k) {  // the candidates' path draws what the row's does
          const TopKRow c = topk_row(row, kTopK);
          Sampler full(so), top(so);
          ASSERT_TRUE(top.covered_by(kTopK, static_cast<int64_t>(n)));
          for (int d = 0; d < 50; ++d) EXPECT_EQ(top.sample_top(c.ids, c.logits, static_cast<int64_t>(n)), full.sample(row));
        }
      }
}

// The penalties change only the window's tokens, as llama.cpp's penalties sampler: l / r when l > 0
// else l * r, minus count x frequency + presence; the window holds the last penalty_last_n accepted
// tokens. Penalties need the whole row (not covered by candidates); options out of range are refused.
TEST(Sampler, PenaltiesChangeTheWindowsLogits) {
  const std::vector<float> row = {2.0f, 1.9f, -1.0f, -1.05f, 0.5f};
  SamplerOptions so{0.0f, 0, 1.0f, 1};
  so.repeat_penalty = 1.1f;  // 2 / 1.1 = 1.82 < 1.9: token 1 wins once 0 was seen
  Sampler rep(so);
  EXPECT_TRUE(rep.penalizes());
  EXPECT_FALSE(rep.covered_by(kTopK, kTopK));
  EXPECT_EQ(rep.sample(row), 0);  // nothing accepted yet
  rep.accept(0);
  EXPECT_EQ(rep.sample(row), 1);
  so = SamplerOptions{0.0f, 0, 1.0f, 1};
  so.frequency_penalty = 0.06f;  // 2 - 2 x 0.06 = 1.88 < 1.9, one occurrence (1.94) is not enough
  so.penalty_last_n = 2;
  Sampler freq(so);
  freq.accept(0);
  EXPECT_EQ(freq.sample(row), 0);
  freq.accept(0);
  EXPECT_EQ(freq.sample(row), 1);
  freq.accept(4);  // the window of 2 now holds {0, 4}: one occurrence of 0 again
  EXPECT_EQ(freq.sample(row), 0);
  so = SamplerOptions{0.0f, 0, 1.0f, 1};
  so.presence_penalty = 0.2f;
  Sampler pres(so);
  for (int i = 0; i < 5; ++i) pres.accept(0);  // presence counts once: 1.8 < 1.9
  EXPECT_EQ(pres.sample(row), 1);
  so = SamplerOptions{0.0f, 0, 1.0f, 1};
  so.repeat_penalty = 1.1f;
  so.penalty_last_n = 0;  // window 0: off
  Sampler off(so);
  EXPECT_FALSE(off.penalizes());
  off.accept(0);
  EXPECT_EQ(off.sample(row), 0);
  so = SamplerOptions{0.0f, 0, 1.0f, 1};
  so.repeat_penalty = 1.1f;  // a negative logit is multiplied: -1 x 1.1 = -1.1 < -1.05
  Sampler neg(so);
  neg.accept(0);
  EXPECT_EQ(neg.sample(std::vector<float>{-1.0f, -1.05f}), 1);
  for (auto bad : std::vector<std::function<void(SamplerOptions&)>>{
           [](SamplerOptions& o) { o.min_p = 1.5f; }, [](SamplerOptions& o) { o.min_p = -0.1f; },
           [](SamplerOptions& o) { o.repeat_penalty = 0; }, [](SamplerOptions& o) { o.presence_penalty = 2.5f; },
           [](SamplerOptions& o) { o.frequency_penalty = -3; }, [](SamplerOptions& o) { o.penalty_last_n = -2; }}) {
    SamplerOptions o;
    bad(o);
    EXPECT_THROW(Sampler{o}, Error);
  }
}

// OpenAI's logit_bias: added to the token's logits before the penalties; -100 all but bans a
// token; a biased sampler needs the whole row (no argmax op, no top-k candidates); ids past the
// vocabulary and biases outside [-100, 100] are refused.
TEST(Sampler, LogitBiasMovesTokensBeforeThePenalties) {
  const std::vector<float> row = {2.0f, 1.9f, -1.0f, -1.05f, 0.5f};
  SamplerOptions so{0.0f, 0, 1.0f, 1};
  so.logit_bias = {{0, -0.2f}};  // 1.8 < 1.9
  Sampler bias(so);
  EXPECT_FALSE(bias.decides_by_argmax());
  EXPECT_FALSE(bias.covered_by(kTopK, kTopK));
  EXPECT_FALSE(bias.penalizes());
  EXPECT_EQ(bias.sample(row), 1);
  so.logit_bias = {{3, 1.5f}, {3, 1.5f}};  // repeated ids add up: -1.05 + 3 = 1.95 < 2
  EXPECT_EQ(Sampler(so).sample(row), 0);
  so.logit_bias = {{3, 1.5f}, {3, 1.6f}};  // 2.05
  EXPECT_EQ(Sampler(so).sample(row), 3);
  so.logit_bias = {{0, -100}, {1, -100}, {4, -100}, {2, -100}};
  so.temperature = 1.0f;
  Sampler ban(so);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(ban.sample(row), 3);
  // Bias first, then llama.cpp's repeat penalty (llama.cpp's sampler chain): token 4 seen, biased by
  // 1.5: (0.5 + 1.5) / 1.1 = 1.82 < 1.9 (penalty first would give 0.5 / 1.1 + 1.5 = 1.95 > 1.9).
  so = SamplerOptions{0.0f, 0, 1.0f, 1};
  so.logit_bias = {{4, 1.5f}};
  so.repeat_penalty = 1.1f;
  Sampler both(so);
  EXPECT_EQ(both.sample(row), 0);  // nothing seen yet: 0.5 + 1.5 = 2.0 ties token 0; ties go to the lower id
  both.accept(0);
  both.accept(4);
  EXPECT_EQ(both.sample(row), 1);
  for (auto bad : std::vector<std::function<void(SamplerOptions&)>>{[](SamplerOptions& o) { o.logit_bias = {{1, 100.5f}}; },
                                                                      [](SamplerOptions& o) { o.logit_bias = {{-1, 1}}; },
                                                                      [](SamplerOptions& o) { o.logit_bias = {{1, NAN}}; }}) {
    SamplerOptions o;
    bad(o);
    EXPECT_THROW(Sampler{o}, Error);
  }
  so = SamplerOptions{};
  so.logit_bias = {{4, 1}};
  EXPECT_NO_THROW(check_logit_bias(so, 5));
  EXPECT_THROW(check_logit_bias(so, 4), Error);
}

// A penalty so strong that it pushes a logit past the float range saturates it (the likeliest or
// least likely token there is) instead of failing the row as non-finite.
TEST(Sampler, ExtremePenaltiesSaturate) {
  const std::vector<float> row = {2.0f, 1.9f, -1.0f, -1.05f, 0.5f};
  for (float temperature : {0.0f, 0.8f}) {
    SamplerOptions so{temperature, 0, 1.0f, 1};
    so.repeat_penalty = 1e-38f;  // 0.5 / 1e-38 overflows: token 4 becomes the likeliest there is
    Sampler tiny(so);
    tiny.accept(4);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(tiny.sample(row), 4);
    so.repeat_penalty = 1e6f;
    Sampler huge(so);
    huge.accept(2);
    huge.accept(3);
    const std::vector<float> low = {-1e38f, -3e38f, -1e38f, -2e38f, -1e38f};  // x 1e6 overflows to -inf
    for (int i = 0; i < 20; ++i) {
      const int32_t t = huge.sample(low);
      EXPECT_TRUE(t == 0 || t == 4) << t;
    }
  }
}

// row_logprobs is the log-softmax of the row: exp of every logprob sums to 1, each equals
// l - log(sum exp l) computed here in long double, and `top` holds the n best by (logit desc, id asc),
// ties included, for n = 0, 1, 7 and more than the row; generated_logprob adds the chosen token
// wherever it sits and each entry's bytes.
TEST(Sampler, RowLogprobsAreTheLogSoftmax) {
  const size_t n = 700;
  std::vector<float> row(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (auto& v : row) v = normal(rng) + 40.0f;  // large logits: a naive exp would overflow in float
  row[100] = row[600] = row[300] = 55.0f;         // a three-way tie at the top, ids out of order
  long double sum = 0;
  for (float v : row) sum += std::exp(static_cast<long double>(v) - 55.0L);
  const long double log_sum = 55.0L + std::log(sum);
  const std::vector<int32_t> order = host_sort(row, static_cast<int64_t>(n)).ids;
  for (int n_top : {0, 1, 7, 1000}) {
    const RowLogprobs r = row_logprobs(row, n_top);
    EXPECT_NEAR(r.log_sum, static_cast<double>(log_sum), 1e-9);
    ASSERT_EQ(r.top.size(), std::min<size_t>(static_cast<size_t>(n_top), n)) << n_top;
    double mass = 0;
    for (size_t k = 0; k < r.top.size(); ++k) {
      EXPECT_EQ(r.top[k].first, order[k]) << "n_top " << n_top << " rank " << k;
      EXPECT_NEAR(r.top[k].second, static_cast<double>(row[static_cast<size_t>(order[k])] - log_sum), 1e-9);
      mass += std::exp(r.top[k].second);
    }
    if (n_top >= static_cast<int>(n)) {
      EXPECT_NEAR(mass, 1.0, 1e-9);
    }
  }
  EXPECT_EQ(row_logprobs(row, 3).top[0].first, 100);  // ties to the lower id
  const GeneratedLogprob g = generated_logprob(row, 5, 2, [](int32_t t) { return "t" + std::to_string(t); });
  EXPECT_EQ(g.token.id, 5);
  EXPECT_EQ(g.token.bytes, "t5");
  EXPECT_NEAR(g.token.logprob, static_cast<double>(row[5] - log_sum), 1e-9);
  ASSERT_EQ(g.top.size(), 2u);
  EXPECT_EQ(g.top[1].id, 300);
  EXPECT_EQ(g.top[1].bytes, "t300");
  EXPECT_TRUE(generated_logprob(row, 5, 2).token.bytes.empty());
}

}  // namespace
}  // namespace mk
