// Decode ms/token of the reference backend and the CPU interpreter (1 and 2 workers, each schedule)
// on stories260K and on synth:stories110m (random float32 weights in stories110M's shape: n_embd 768,
// 12 layers, 12 heads, n_ff 2048, vocab 32000; 438 MB read per token).
// Run: build/bench/mk_bench --benchmark_filter=CpuDecode
// Figures go into docs/PERFORMANCE.md.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "archs/arch.h"
#include "backend/backend.h"
#include "backend/cpu/float_gemm.h"
#include "runtime/session.h"

using namespace mk;

namespace {

// Models and compiled backends are built once per process: Google Benchmark calls a benchmark
// function several times while it sizes the iteration count.
struct Loaded {
  ModelFile model;
  Graph graph;
  int64_t n_vocab = 0;
};

Loaded& loaded(const std::string& path) {
  static std::map<std::string, std::unique_ptr<Loaded>> cache;
  auto& slot = cache[path];
  if (!slot) {
    slot = std::make_unique<Loaded>();
    slot->model = open_model(path);
    slot->n_vocab = read_hparams(slot->model).n_vocab;
    slot->graph = build_graph(slot->model, BuildOptions{512, false});
  }
  return *slot;
}

Backend& backend(const std::string& path, const std::string& name, int threads, const std::string& schedule) {
  static std::map<std::string, std::unique_ptr<Backend>> cache;
  std::string key = path + "|" + name + "|" + std::to_string(threads) + "|" + schedule;
  auto& slot = cache[key];
  if (!slot) {
    Loaded& l = loaded(path);
    BackendOptions o;
    o.threads = threads;
    o.schedule = schedule;
    slot = make_backend(name, l.graph, l.model, o);
  }
  return *slot;
}

void BM_CpuDecode(benchmark::State& state, const std::string& path, const std::string& name, int threads,
                  const std::string& schedule) {
  Backend& b = backend(path, name, threads, schedule);
  const int64_t vocab = loaded(path).n_vocab;
  // Decode at positions 64..127 (a short prompt's worth of cache), then start over.
  int64_t n_past = 0;
  int32_t tok = 1;
  auto refill = [&] {
    b.reset();
    std::vector<int32_t> prompt(64);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 1) % vocab);
    b.forward(prompt, 0);
    n_past = 64;
  };
  refill();
  int64_t n = 0;
  for (auto _ : state) {
    if (n_past >= 128) {
      state.PauseTiming();
      refill();
      state.ResumeTiming();
    }
    auto logits = b.forward(std::span<const int32_t>(&tok, 1), n_past++);
    benchmark::DoNotOptimize(logits.data());
    tok = static_cast<int32_t>((tok * 31 + 7) % vocab);
    ++n;
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
  state.counters["ms/token"] =
      benchmark::Counter(static_cast<double>(n) / 1000.0, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// SmolLM2-135M-Instruct Q4_1 (scripts/get-model.sh smollm2), where it has been fetched.
std::string smollm2_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string cache = xdg && *xdg ? xdg : std::string(home ? home : "") + "/.cache";
  return cache + "/megakernel/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// Any GGUF named by MK_BENCH_MODEL (its batched-decode ratio next to SmolLM2 Q4_1's: other block
// types, e.g. llama.cpp's Q3_K_M / IQ4_XS requantizations); skipped when unset.
std::string env_model_path() {
  const char* p = std::getenv("MK_BENCH_MODEL");
  return p && *p ? p : "(MK_BENCH_MODEL unset)";
}

bool model_present(benchmark::State& state, const std::string& path) {
  if (path.rfind("synth:", 0) == 0 || std::filesystem::exists(path)) return true;
  state.SkipWithError((path + " not found (scripts/get-model.sh smollm2)").c_str());
  return false;
}

// Continuous batching: n_seqs sequences decode together, one row each per step (a ragged batch
// over the paged KV pool, blocks interleaved between sequences), at positions 64..127. tokens/s
// counts rows; compare n_seqs = 1 with more to see what one step's shared weight reads buy.
void BM_CpuBatchedDecode(benchmark::State& state, const std::string& path, int threads, int n_seqs) {
  if (!model_present(state, path)) return;
  Loaded& l = loaded(path);
  BuildOptions bo{128, false};
  bo.kv_pool_tokens = 128 * n_seqs;
  bo.kv_block_size = 16;
  Graph g = build_graph(l.model, bo);
  BackendOptions o;
  o.threads = threads;
  // MK_BENCH_TRACE=file: a Chrome trace of the run (its summary, time per opcode, goes to stderr)
  if (const char* t = std::getenv("MK_BENCH_TRACE")) o.trace_path = t;
  // MK_BENCH_ATTN_SPLITS=S: attention as S partials per KV group and a combine (flash-decoding)
  if (const char* s = std::getenv("MK_BENCH_ATTN_SPLITS")) o.attn_splits = std::atoi(s);
  // MK_BENCH_HEAD_TILES=1: q/k/v tiled in whole heads (BackendOptions::head_tiles, the tiling before 2026-12-06)
  if (const char* h = std::getenv("MK_BENCH_HEAD_TILES")) o.head_tiles = std::string(h) == "1";
  auto b = make_backend("cpu", g, l.model, o);
  StepBatch batch;
  for (int s = 0; s < n_seqs; ++s) {  // block j of sequence s is j * n_seqs + s: interleaved
    batch.block_tables.emplace_back();
    for (int j = 0; j < 8; ++j) batch.block_tables.back().push_back(j * n_seqs + s);
  }
  int64_t pos = 0;
  auto refill = [&] {
    b->reset();
    for (int s = 0; s < n_seqs; ++s) {  // one 64-row prefill chunk per step (rows per step <= n_ctx)
      StepBatch p = batch;
      for (int i = 0; i < 64; ++i) {
        p.tokens.push_back(static_cast<int32_t>((i * 37 + s * 11 + 1) % l.n_vocab));
        p.positions.push_back(i);
        p.seq.push_back(s);
      }
      b->forward(p);
    }
    pos = 64;
  };
  refill();
  int64_t n = 0;
  for (auto _ : state) {
    if (pos >= 128) {
      state.PauseTiming();
      refill();
      state.ResumeTiming();
    }
    StepBatch d = batch;
    for (int s = 0; s < n_seqs; ++s) {
      d.tokens.push_back(static_cast<int32_t>((pos * 31 + s * 7) % l.n_vocab));
      d.positions.push_back(static_cast<int32_t>(pos));
      d.seq.push_back(s);
      d.logit_rows.push_back(s);
    }
    auto logits = b->forward(d);
    benchmark::DoNotOptimize(logits.data());
    ++pos;
    n += n_seqs;
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
}

// Prompt processing: one forward of n_prompt tokens from an empty cache (a 150-token prompt is
// bench/llamacpp_compare.sh's); tokens/s counts prompt tokens.
void BM_CpuPrefill(benchmark::State& state, const std::string& path, int threads, int n_prompt) {
  if (!model_present(state, path)) return;
  Backend& b = backend(path, "cpu", threads, "dynamic");
  const int64_t vocab = loaded(path).n_vocab;
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 1) % vocab);
  int64_t n = 0;
  for (auto _ : state) {
    b.reset();
    auto logits = b.forward(prompt, 0);
    benchmark::DoNotOptimize(logits.data());
    n += n_prompt;
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
}

const std::string kStories260K = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.bin";
const std::string kSynth110M = "synth:stories110m";


// The float32 many-row tile alone (src/backend/cpu/float_gemm.h), one thread: R activation rows x
// 2048 weight rows of K = 768 (6 MiB of weights, past L2), 64 weight rows per call as matmul()
// passes float32 weights. isa -1: dot_f32 per (row, column), as the one-row path computes. GFLOP/s
// counts a multiply and an add per element; on a loaded machine read the CPU column. copies > 1:
// that many copies of the weights (11: 66 MiB, past a 32 MiB L3), one per iteration in turn, so
// that they stream from memory as a model's do.
void BM_FloatGemm(benchmark::State& state, int isa, int64_t R, int64_t copies = 1) {
  const int64_t K = 768, C = 2048;
  const auto fisa = static_cast<cpu::FloatIsa>(isa);
  if (isa >= 0 && !cpu::float_isa_runs(fisa)) return state.SkipWithError("ISA not run by this CPU");
  std::vector<float> x(static_cast<size_t>(R * K)), w(static_cast<size_t>(copies * C * K)), out(static_cast<size_t>(R * C));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) * 0.01f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 89) * 0.01f;
  std::vector<const float*> all_rows(static_cast<size_t>(copies * C));
  for (int64_t j = 0; j < copies * C; ++j) all_rows[static_cast<size_t>(j)] = &w[static_cast<size_t>(j * K)];
  int64_t copy = 0;
  for (auto _ : state) {
    const std::span<const float*> rows(all_rows.data() + copy * C, static_cast<size_t>(C));
    copy = copy + 1 == copies ? 0 : copy + 1;
    for (int64_t j = 0; j < C; j += 64) {
      if (isa < 0) {
        for (int64_t q = j; q < j + 64; ++q)
          for (int64_t r = 0; r < R; ++r)
            out[static_cast<size_t>(r * C + q)] =
                cpu::dot_f32(&x[static_cast<size_t>(r * K)], rows[static_cast<size_t>(q)], K);
      } else {
        cpu::gemm_f32(x.data(), K, R, rows.data() + j, 64, K, out.data() + j, C, fisa);
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double flops = 2.0 * static_cast<double>(R * C * K) * static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_FloatGemm, dot_rows16, -1, 16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FloatGemm, portable_rows16, 0, 16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FloatGemm, avx2_rows16, 1, 16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FloatGemm, avx512_rows16, 2, 16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FloatGemm, dot_rows1, -1, 1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FloatGemm, avx512_rows16_streamed, 2, 16, 11)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FloatGemm, avx512_rows4_streamed, 2, 4, 11)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FloatGemm, dot_rows1_streamed, -1, 1, 11)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

#define MK_CPU_BENCH(tag, path)                                                                              \
  BENCHMARK_CAPTURE(BM_CpuDecode, tag##_reference, path, "reference", 1, "dynamic")->Unit(benchmark::kMillisecond)->UseRealTime(); \
  BENCHMARK_CAPTURE(BM_CpuDecode, tag##_cpu_t1_dynamic, path, "cpu", 1, "dynamic")->Unit(benchmark::kMillisecond)->UseRealTime();   \
  BENCHMARK_CAPTURE(BM_CpuDecode, tag##_cpu_t2_dynamic, path, "cpu", 2, "dynamic")->Unit(benchmark::kMillisecond)->UseRealTime();   \
  BENCHMARK_CAPTURE(BM_CpuDecode, tag##_cpu_t1_static_rr, path, "cpu", 1, "static-rr")->Unit(benchmark::kMillisecond)->UseRealTime(); \
  BENCHMARK_CAPTURE(BM_CpuDecode, tag##_cpu_t2_static_rr, path, "cpu", 2, "static-rr")->Unit(benchmark::kMillisecond)->UseRealTime(); \
  BENCHMARK_CAPTURE(BM_CpuDecode, tag##_cpu_t1_static_cp, path, "cpu", 1, "static-cp")->Unit(benchmark::kMillisecond)->UseRealTime(); \
  BENCHMARK_CAPTURE(BM_CpuDecode, tag##_cpu_t2_static_cp, path, "cpu", 2, "static-cp")->Unit(benchmark::kMillisecond)->UseRealTime();

MK_CPU_BENCH(stories260K, kStories260K)
MK_CPU_BENCH(synth_stories110m, kSynth110M)

// Read bandwidth of this machine in the same run, for the ratio in docs/PERFORMANCE.md: each of
// `threads` threads sums its share of a 512 MiB float array with a vectorisable loop.
static void BM_ReadBandwidth(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  static std::vector<float> data(size_t{128} << 20, 1.0f);
  std::vector<float> sums(static_cast<size_t>(threads) * 16);
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const size_t n = data.size() / static_cast<size_t>(threads), b = n * static_cast<size_t>(t);
        float acc[16] = {};
        for (size_t i = 0; i + 16 <= n; i += 16)
          for (int l = 0; l < 16; ++l) acc[l] += data[b + i + static_cast<size_t>(l)];
        for (int l = 0; l < 16; ++l) sums[static_cast<size_t>(t) * 16 + static_cast<size_t>(l)] = acc[l];
      });
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(data.size() * 4) * static_cast<double>(state.iterations()) / 1e9,
                                              benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_CAPTURE(BM_CpuBatchedDecode, stories260K_cpu_t2_seqs1, kStories260K, 2, 1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CpuBatchedDecode, stories260K_cpu_t2_seqs8, kStories260K, 2, 8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CpuBatchedDecode, synth110m_cpu_t2_seqs1, kSynth110M, 2, 1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CpuBatchedDecode, synth110m_cpu_t2_seqs8, kSynth110M, 2, 8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CpuBatchedDecode, synth110m_cpu_t2_seqs16, kSynth110M, 2, 16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CpuBatchedDecode, smollm2_cpu_t2_seqs1, smollm2_path(), 2, 1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CpuBatchedDecode, smollm2_cpu_t2_seqs16, smollm2_path(), 2, 16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CpuBatchedDecode, env_model_cpu_t2_seqs1, env_model_path(), 2, 1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CpuBatchedDecode, env_model_cpu_t2_seqs16, env_model_path(), 2, 16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CpuPrefill, synth110m_cpu_t2_prompt150, kSynth110M, 2, 150)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_CpuPrefill, smollm2_cpu_t2_prompt150, smollm2_path(), 2, 150)->Unit(benchmark::kMillisecond)->UseRealTime();
