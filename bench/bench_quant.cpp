// Quantized weights on the CPU: the per-type dot product (weights/s and weight bytes/s of one thread
// streaming a 256 x 4096 matrix against one float32 activation row, every instruction-set variant
// this CPU has) and decode tokens/s of the stories110M shape (768 wide, random weights) quantized in
// memory to each type, on the cpu backend with 2 workers, against its float32 self.
// Run: build/bench/mk_bench --benchmark_filter='QuantDot|QuantGemm|QuantDecode'
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/synth.h"
#include "quant/quant.h"

using namespace mk;

namespace {

void BM_QuantDot(benchmark::State& state, DType t, quant::DotIsa isa) {
  const quant::QuantType* q = quant::quant_type(t);
  if (!quant::dot_isa_available(isa)) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  const int64_t K = 4096, N = 256;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(K * N)), x(static_cast<size_t>(K));
  for (auto& v : w) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  const size_t row_bytes = dtype_bytes(t, K);
  std::vector<uint8_t> qw(row_bytes * N);
  for (int64_t r = 0; r < N; ++r) q->quantize_row(w.data() + r * K, qw.data() + static_cast<size_t>(r) * row_bytes, K);
  auto dot = q->dot_variants[static_cast<int>(isa)];
  for (auto _ : state) {
    float s = 0;
    for (int64_t r = 0; r < N; ++r) s += dot(qw.data() + static_cast<size_t>(r) * row_bytes, x.data(), K);
    benchmark::DoNotOptimize(s);
  }
  state.counters["Gweights/s"] =
      benchmark::Counter(static_cast<double>(K * N) * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.SetBytesProcessed(static_cast<int64_t>(qw.size()) * state.iterations());
}

void BM_QuantDecode(benchmark::State& state, std::optional<DType> t) {
  static const ModelFile f32 = make_synthetic_model(synthetic_spec("stories110m"));
  const ModelFile m = t ? quant::quantize_model(f32, *t) : quant::quantize_model(f32, [](const WeightTensor&) {
    return std::optional<DType>{};
  });
  Graph g = build_graph(m, BuildOptions{256, false});
  BackendOptions o;
  o.threads = 2;
  auto b = make_backend("cpu", g, m, o);
  int32_t tok = 1;
  int64_t n_past = 0, n = 0;
  for (auto _ : state) {
    if (n_past >= 256) {
      state.PauseTiming();
      b->reset();
      n_past = 0;
      state.ResumeTiming();
    }
    auto logits = b->forward(std::span<const int32_t>(&tok, 1), n_past++);
    benchmark::DoNotOptimize(logits.data());
    tok = static_cast<int32_t>((tok * 31 + 7) % 32000);
    ++n;
  }
  size_t bytes = 0;
  for (const WeightTensor& w : m.tensors()) bytes += w.nbytes;
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsRate);
  state.counters["weight MB"] = static_cast<double>(bytes) / 1e6;
}

// N weight rows and R activation rows of K elements, normal(0, 0.02), quantized to type t (rows
// row_bytes apart) and to its 8-bit activation blocks (xrow apart).
struct GemmInputs {
  size_t row_bytes = 0, xrow = 0;
  std::vector<uint8_t> qw, xq;
};
GemmInputs gemm_inputs(DType t, int64_t K, int64_t N, int64_t R) {
  const quant::QuantType* q = quant::quant_type(t);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(K * N)), x(static_cast<size_t>(K * R));
  for (auto& v : w) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  GemmInputs in;
  in.row_bytes = dtype_bytes(t, K);
  in.xrow = static_cast<size_t>(K / q->act->block_size * q->act->block_bytes);
  in.qw.resize(in.row_bytes * static_cast<size_t>(N));
  in.xq.resize(in.xrow * static_cast<size_t>(R));
  for (int64_t r = 0; r < N; ++r) q->quantize_row(w.data() + r * K, in.qw.data() + static_cast<size_t>(r) * in.row_bytes, K);
  for (int64_t r = 0; r < R; ++r) q->act->quantize_row(x.data() + r * K, in.xq.data() + static_cast<size_t>(r) * in.xrow, K);
  return in;
}

// Matmul tile with 8-bit activations: N = 256 weight rows of K = 576 (SmolLM2's width, so the tile
// stays in L2 as an interpreter tile does) against R activation rows. variant -1: what matmul did before
// gemm_act (dot_act4 per weight row over groups of four activation rows, dot_act for the rest), else
// gemm_act_variants[variant]. Gmacs/s = K * N * R per second of CPU time.
void BM_QuantGemm(benchmark::State& state, DType t, int variant) {
  const quant::QuantType* q = quant::quant_type(t);
  const int64_t R = state.range(0);
  if (variant >= 0 && !quant::gemm_isa_available(static_cast<quant::GemmIsa>(variant))) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  const int64_t K = q->block_size == 256 ? 768 : 576, N = 256;  // a small model's n_embd, whole blocks
  const GemmInputs in = gemm_inputs(t, K, N, R);
  const size_t row_bytes = in.row_bytes, xrow = in.xrow;
  const std::vector<uint8_t>& qw = in.qw;
  const std::vector<uint8_t>& xq = in.xq;
  std::vector<float> out(static_cast<size_t>(N * R));
  for (auto _ : state) {
    if (variant >= 0) {
      q->gemm_act_variants[variant](qw.data(), row_bytes, N, xq.data(), xrow, R, K, out.data(), N);
    } else {
      for (int64_t j = 0; j < N; ++j) {
        const uint8_t* wr = qw.data() + static_cast<size_t>(j) * row_bytes;
        int64_t r = 0;
        for (; q->dot_act4 && r + 4 <= R; r += 4) {  // q5_0 / q5_1 have no dot_act4: dot_act per row
          const void* xr[4] = {&xq[r * xrow], &xq[(r + 1) * xrow], &xq[(r + 2) * xrow], &xq[(r + 3) * xrow]};
          float o4[4];
          q->dot_act4(wr, xr, K, o4);
          for (int i = 0; i < 4; ++i) out[static_cast<size_t>((r + i) * N + j)] = o4[i];
        }
        for (; r < R; ++r) out[static_cast<size_t>(r * N + j)] = q->dot_act(wr, &xq[r * xrow], K);
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["Gmacs/s"] = benchmark::Counter(static_cast<double>(K * N * R) * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}

// Copies of one matrix's bytes filling 64 MiB (past a 32 MiB L3), on 2 MiB pages where the kernel
// gives them (as the cpu backend's weights), handed out in turn: each call then streams its weights
// from memory as a decode step does.
class WeightCopies {
 public:
  WeightCopies(const uint8_t* src, size_t bytes)
      : bytes_(bytes), copies_((size_t{64} << 20) / bytes + 1), mem_(nullptr, &std::free) {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t total = (bytes_ * copies_ + kHuge - 1) / kHuge * kHuge;
    mem_.reset(static_cast<uint8_t*>(std::aligned_alloc(kHuge, total)));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    ::madvise(mem_.get(), total, MADV_HUGEPAGE);
#endif
    for (size_t c = 0; c < copies_; ++c) std::copy_n(src, bytes_, mem_.get() + c * bytes_);
  }
  const uint8_t* next() {
    const uint8_t* p = mem_.get() + next_ * bytes_;
    next_ = next_ + 1 == copies_ ? 0 : next_ + 1;
    return p;
  }

 private:
  size_t bytes_, copies_, next_ = 0;
  std::unique_ptr<uint8_t, decltype(&std::free)> mem_;
};

// gemm_act_packed (quant.h: q4_0, q4_1, q8_0 weights packed 16 rows per group at load) on the same
// shapes as BM_QuantGemm; variant 3 = the AVX-512 VNNI tile, 4 = the AMX tile. N = 1536 here (a
// SmolLM2 FFN matrix) so the AMX tile runs over many groups as in the product. streamed: the
// weights come from memory (WeightCopies), as in a decode step, instead of L2.
void BM_QuantGemmPacked(benchmark::State& state, DType t, int variant, bool streamed = false) {
  const quant::QuantType* q = quant::quant_type(t);
  const int64_t R = state.range(0);
  if (!quant::gemm_isa_available(static_cast<quant::GemmIsa>(variant)) || q->gemm_act_packed_variants[variant] == nullptr) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  const int64_t K = 576, N = 1536;
  const GemmInputs in = gemm_inputs(t, K, N, R);
  std::vector<uint8_t> packed(q->packed_bytes(N, K));
  q->pack(in.qw.data(), in.row_bytes, N, K, packed.data());
  std::optional<WeightCopies> copies;
  if (streamed) copies.emplace(packed.data(), packed.size());
  std::vector<float> out(static_cast<size_t>(N * R));
  for (auto _ : state) {
    q->gemm_act_packed_variants[variant](copies ? copies->next() : packed.data(), N, in.xq.data(), in.xrow, R, K,
                                         out.data(), N);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["Gmacs/s"] = benchmark::Counter(static_cast<double>(K * N * R) * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}

// gemm_act_variants[variant] (unpacked GGUF rows, as the K-quants run; BM_QuantGemm's shape) with the
// weights streamed from memory (WeightCopies).
void BM_QuantGemmStreamed(benchmark::State& state, DType t, int variant) {
  const quant::QuantType* q = quant::quant_type(t);
  const int64_t R = state.range(0);
  if (!quant::gemm_isa_available(static_cast<quant::GemmIsa>(variant))) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  const int64_t K = q->block_size == 256 ? 768 : 576, N = 256;
  const GemmInputs in = gemm_inputs(t, K, N, R);
  WeightCopies w(in.qw.data(), in.qw.size());
  std::vector<float> out(static_cast<size_t>(N * R));
  for (auto _ : state) {
    q->gemm_act_variants[variant](w.next(), in.row_bytes, N, in.xq.data(), in.xrow, R, K, out.data(), N);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["Gmacs/s"] = benchmark::Counter(static_cast<double>(K * N * R) * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}

}  // namespace

#define MK_QUANT_GEMM_BENCH(T)                                                                                        \
  BENCHMARK_CAPTURE(BM_QuantGemm, T##_dot_act, DType::T, -1)->Arg(1)->Arg(4)->Arg(16)->Arg(150)->MeasureProcessCPUTime(); \
  BENCHMARK_CAPTURE(BM_QuantGemm, T##_avx2, DType::T, 1)->Arg(1)->Arg(4)->Arg(16)->Arg(150)->MeasureProcessCPUTime();     \
  BENCHMARK_CAPTURE(BM_QuantGemm, T##_avxvnni, DType::T, 2)->Arg(1)->Arg(4)->Arg(16)->Arg(150)->MeasureProcessCPUTime();  \
  BENCHMARK_CAPTURE(BM_QuantGemm, T##_avx512vnni, DType::T, 3)->Arg(1)->Arg(4)->Arg(16)->Arg(150)->MeasureProcessCPUTime(); \
  BENCHMARK_CAPTURE(BM_QuantGemm, T##_amx, DType::T, 4)->Arg(1)->Arg(4)->Arg(16)->Arg(150)->MeasureProcessCPUTime();
#define MK_QUANT_GEMM_PACKED_BENCH(T)                                                                         \
  BENCHMARK_CAPTURE(BM_QuantGemmPacked, T##_avx2, DType::T, 1)->Arg(1)->Arg(16)->MeasureProcessCPUTime(); \
  BENCHMARK_CAPTURE(BM_QuantGemmPacked, T##_avx2_streamed, DType::T, 1, true)->Arg(1)->Arg(16)->UseRealTime(); \
  BENCHMARK_CAPTURE(BM_QuantGemmPacked, T##_avx512vnni, DType::T, 3)->Arg(1)->Arg(16)->MeasureProcessCPUTime(); \
  BENCHMARK_CAPTURE(BM_QuantGemmPacked, T##_amx, DType::T, 4)->Arg(16)->Arg(32)->MeasureProcessCPUTime(); \
  BENCHMARK_CAPTURE(BM_QuantGemmPacked, T##_avx512vnni_streamed, DType::T, 3, true)->Arg(1)->Arg(16)->UseRealTime();
MK_QUANT_GEMM_PACKED_BENCH(Q4_0)
MK_QUANT_GEMM_PACKED_BENCH(Q4_1)
MK_QUANT_GEMM_PACKED_BENCH(Q8_0)
MK_QUANT_GEMM_BENCH(Q4_0)
MK_QUANT_GEMM_BENCH(Q4_1)
MK_QUANT_GEMM_BENCH(Q5_0)
MK_QUANT_GEMM_BENCH(Q5_1)
MK_QUANT_GEMM_BENCH(Q8_0)
MK_QUANT_GEMM_BENCH(Q2_K)
MK_QUANT_GEMM_BENCH(Q3_K)
MK_QUANT_GEMM_BENCH(Q4_K)
BENCHMARK_CAPTURE(BM_QuantGemmStreamed, Q4_K_avx512vnni, DType::Q4_K, 3)->Arg(1)->Arg(4)->Arg(16)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantGemmStreamed, Q6_K_avx512vnni, DType::Q6_K, 3)->Arg(1)->Arg(4)->Arg(16)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantGemmStreamed, Q4_1_avx512vnni, DType::Q4_1, 3)->Arg(1)->Arg(4)->Arg(16)->UseRealTime();
MK_QUANT_GEMM_BENCH(Q5_K)
MK_QUANT_GEMM_BENCH(Q6_K)
MK_QUANT_GEMM_BENCH(IQ4_NL)
MK_QUANT_GEMM_BENCH(IQ4_XS)

// One thread, timed in process CPU time: comparable between variants on a shared, loaded machine.
#define MK_QUANT_DOT_BENCH(T)                                                                               \
  BENCHMARK_CAPTURE(BM_QuantDot, T##_generic, DType::T, quant::DotIsa::generic)->MeasureProcessCPUTime(); \
  BENCHMARK_CAPTURE(BM_QuantDot, T##_avx2, DType::T, quant::DotIsa::avx2)->MeasureProcessCPUTime();       \
  BENCHMARK_CAPTURE(BM_QuantDot, T##_avx512, DType::T, quant::DotIsa::avx512)->MeasureProcessCPUTime();
MK_QUANT_DOT_BENCH(Q4_0)
MK_QUANT_DOT_BENCH(Q4_1)
MK_QUANT_DOT_BENCH(Q5_0)
MK_QUANT_DOT_BENCH(Q5_1)
MK_QUANT_DOT_BENCH(Q8_0)
MK_QUANT_DOT_BENCH(Q2_K)
MK_QUANT_DOT_BENCH(Q3_K)
MK_QUANT_DOT_BENCH(Q4_K)
MK_QUANT_DOT_BENCH(Q5_K)
MK_QUANT_DOT_BENCH(Q6_K)

BENCHMARK_CAPTURE(BM_QuantDecode, stories110m_f32, std::nullopt)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantDecode, stories110m_q8_0, DType::Q8_0)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantDecode, stories110m_q4_0, DType::Q4_0)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantDecode, stories110m_q4_K, DType::Q4_K)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_QuantDecode, stories110m_q6_K, DType::Q6_K)->Unit(benchmark::kMillisecond)->UseRealTime();
