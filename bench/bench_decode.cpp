// Decode speed per backend: tokens/s and ms/token of single-token steps on stories260K.
// Run: build/bench/mk_bench --benchmark_filter=Decode
#include <benchmark/benchmark.h>

#include "runtime/session.h"

using namespace mk;

namespace {

void BM_Decode(benchmark::State& state, const std::string& model, const std::string& backend, int threads,
               const std::string& schedule) {
  SessionOptions so;
  so.model_path = model;
  so.backend = backend;
  so.backend_options.threads = threads;
  so.backend_options.schedule = schedule;
  so.need_tokenizer = false;
  so.n_ctx = 512;
  Session s(so);
  int32_t tok = 1;
  int64_t n = 0;
  for (auto _ : state) {
    if (s.n_past >= s.n_ctx) {
      state.PauseTiming();
      s.reset();
      state.ResumeTiming();
    }
    auto logits = s.eval(std::span<const int32_t>(&tok, 1));
    benchmark::DoNotOptimize(logits.data());
    tok = static_cast<int32_t>((tok * 31 + 7) % 500);
    ++n;
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
  // Wall-clock per token (the run uses real time: workers are threads, CPU time would overcount).
  state.counters["ms/token"] = benchmark::Counter(static_cast<double>(n) / 1000.0,
                                                  benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";

}  // namespace

BENCHMARK_CAPTURE(BM_Decode, stories260K_reference, kStories, "reference", 1, "dynamic")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
