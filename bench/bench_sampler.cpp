// Sampling one logits row on the host (runtime/sampler.h): the server's default request (temperature
// 1, top_p 1, no top-k) and nucleus sampling without top-k draw from the whole row; `run`'s default
// (top_k 40) from a partial sort. Vocabulary sizes of SmolLM2 (49152) and Llama 3 (128256); the row
// is N(0, 3) logits with a few outliers (a peaked head).
// Run: build/bench/mk_bench --benchmark_filter=BM_Sampler
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "runtime/sampler.h"

using namespace mk;

namespace {

void BM_Sampler(benchmark::State& state, int64_t n_vocab, int top_k, float top_p) {
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> row(static_cast<size_t>(n_vocab));
  for (size_t i = 0; i < row.size(); ++i) row[i] = i % 4099 == 7 ? 14.0f + static_cast<float>(i % 3) : nd(g);
  Sampler s({1.0f, top_k, top_p, 7});
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(row));
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK_CAPTURE(BM_Sampler, v49152_topk0_topp1, 49152, 0, 1.0f)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Sampler, v49152_topk0_topp0.95, 49152, 0, 0.95f)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Sampler, v49152_topk40_topp0.95, 49152, 40, 0.95f)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Sampler, v128256_topk0_topp1, 128256, 0, 1.0f)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Sampler, v128256_topk0_topp0.95, 128256, 0, 0.95f)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Sampler, v128256_topk40_topp0.95, 128256, 40, 0.95f)->Unit(benchmark::kMillisecond);

}  // namespace
