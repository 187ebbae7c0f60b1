// q4_1's gemm_act tile (block-integer numerics, quant.h) on weights repacked 16 rows per block at
// load, against what the product does (src/quant/blockint_x86.h: the same numerics on the GGUF blocks
// where they lie, fetched with gathers). A measurement for a design decision, not a product path:
// repacking saves the gathers but needs a CPU-side copy of every q4_1 matrix.
//
// Repacked layout, per 16-row group and block: four 64-byte chunks holding dword k of each row's 16
// nibble bytes (elements 4k..4k+3 low, 16+4k..16+4k+3 high), then the 16 d and the 16 m as f16. Per
// block 8 vpdpbusd against activation dwords broadcast from memory plus 4 float operations per
// activation row, as the gather tile.
//
// BM_Q41BlockInt/R: N = 256 weight rows of K = 576 against R activation rows, as BM_QuantGemm, so the
// two compare in the same run. Each run first checks that the tile gives dot_act's bits.
// Run: build/bench/mk_bench --benchmark_filter='Q41BlockInt|QuantGemm/Q4_1_avx512vnni'
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "model/dtype.h"
#include "quant/gemm_x86.h"
#include "quant/quant.h"

using namespace mk;

namespace {

constexpr int kQ41Bytes = 20, kQ81Bytes = 36;

float f16(const uint8_t* p) { return quant::detail::ld_f16c(p); }

// q4_1 rows (N a multiple of 16, nb blocks each) to [N / 16][nb][4 x 64 bytes nibble dwords | 16 d | 16 m].
std::vector<uint8_t> repack16(const uint8_t* w, size_t row_bytes, int64_t N, int64_t nb) {
  std::vector<uint8_t> out(static_cast<size_t>(N / 16 * nb * 320));
  for (int64_t g = 0; g < N / 16; ++g)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* o = out.data() + (g * nb + b) * 320;
      for (int r = 0; r < 16; ++r) {
        const uint8_t* p = w + static_cast<size_t>(g * 16 + r) * row_bytes + b * kQ41Bytes;
        for (int k = 0; k < 4; ++k) std::memcpy(o + 64 * k + 4 * r, p + 4 + 4 * k, 4);
        std::memcpy(o + 256 + 2 * r, p, 2);
        std::memcpy(o + 288 + 2 * r, p + 2, 2);
      }
    }
  return out;
}

// 16 weight rows (one repacked group) x NA activation rows; dx/sx: [nb][NA] f32 scales.
template <int NA>
MK_AVX512VNNI_FN void tile16(const uint8_t* g, const uint8_t* const* y, const float* dx, const float* sx, int64_t nb,
                             float* out, int64_t ldo) {
  __m512 acc[NA], summs[NA];
  for (int a = 0; a < NA; ++a) acc[a] = summs[a] = _mm512_setzero_ps();
  const __m512i lo4 = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = g + b * 320;
    __m512i u[8];
    for (int k = 0; k < 4; ++k) {
      const __m512i c = _mm512_loadu_si512(blk + 64 * k);
      u[k] = _mm512_and_si512(c, lo4);                             // elements 4k .. 4k + 3
      u[k + 4] = _mm512_and_si512(_mm512_srli_epi16(c, 4), lo4);  // elements 16 + 4k ..
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 256)));
    const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 288)));
    for (int a = 0; a < NA; ++a) {
      const uint8_t* q = y[a] + b * kQ81Bytes + 4;
      __m512i is = _mm512_setzero_si512();
      for (int k = 0; k < 8; ++k) {
        int32_t v;
        std::memcpy(&v, q + 4 * k, 4);
        is = _mm512_dpbusd_epi32(is, u[k], _mm512_set1_epi32(v));
      }
      acc[a] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dx[b * NA + a])), _mm512_cvtepi32_ps(is), acc[a]);
      summs[a] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx[b * NA + a]), summs[a]);
    }
  }
  for (int a = 0; a < NA; ++a) _mm512_storeu_ps(out + a * ldo, _mm512_add_ps(acc[a], summs[a]));
}

// gemm over repacked weights: activation rows in chunks of up to 8 (their f16 scales to f32 once per
// call), each chunk against every 16-row group. out[a * N + row].
MK_AVX512VNNI_FN void gemm16(const std::vector<uint8_t>& rw, int64_t N, int64_t nb, const uint8_t* xq, size_t xrow,
                             int64_t R, float* out) {
  thread_local std::vector<float> dx, sx;
  dx.resize(static_cast<size_t>(nb * 8));
  sx.resize(static_cast<size_t>(nb * 8));
  for (int64_t a0 = 0; a0 < R; a0 += 8) {
    const int na = static_cast<int>(std::min<int64_t>(8, R - a0));
    const uint8_t* y[8];
    for (int a = 0; a < na; ++a) y[a] = xq + static_cast<size_t>(a0 + a) * xrow;
    for (int64_t b = 0; b < nb; ++b)
      for (int a = 0; a < na; ++a) {
        dx[static_cast<size_t>(b * na + a)] = f16(y[a] + b * kQ81Bytes);
        sx[static_cast<size_t>(b * na + a)] = f16(y[a] + b * kQ81Bytes + 2);
      }
    for (int64_t gi = 0; gi < N / 16; ++gi) {
      const uint8_t* g = rw.data() + static_cast<size_t>(gi * nb * 320);
      float* o = out + a0 * N + gi * 16;
      switch (na) {
        case 1: tile16<1>(g, y, dx.data(), sx.data(), nb, o, N); break;
        case 2: tile16<2>(g, y, dx.data(), sx.data(), nb, o, N); break;
        case 3: tile16<3>(g, y, dx.data(), sx.data(), nb, o, N); break;
        case 4: tile16<4>(g, y, dx.data(), sx.data(), nb, o, N); break;
        case 5: tile16<5>(g, y, dx.data(), sx.data(), nb, o, N); break;
        case 6: tile16<6>(g, y, dx.data(), sx.data(), nb, o, N); break;
        case 7: tile16<7>(g, y, dx.data(), sx.data(), nb, o, N); break;
        default: tile16<8>(g, y, dx.data(), sx.data(), nb, o, N); break;
      }
    }
  }
}

void BM_Q41BlockInt(benchmark::State& state) {
  if (!quant::gemm_isa_available(quant::GemmIsa::avx512vnni)) {
    state.SkipWithError("this CPU lacks AVX-512 VNNI");
    return;
  }
  const quant::QuantType* q = quant::quant_type(DType::Q4_1);
  const int64_t R = state.range(0), K = 576, N = 256, nb = K / 32;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(K * N)), x(static_cast<size_t>(K * R));
  for (auto& v : w) v = nd(rng);
  for (auto& v : x) v = nd(rng);
  const size_t row_bytes = dtype_bytes(DType::Q4_1, K), xrow = static_cast<size_t>(nb * kQ81Bytes);
  std::vector<uint8_t> qw(row_bytes * N), xq(xrow * static_cast<size_t>(R));
  for (int64_t r = 0; r < N; ++r) q->quantize_row(w.data() + r * K, qw.data() + static_cast<size_t>(r) * row_bytes, K);
  for (int64_t r = 0; r < R; ++r) q->act->quantize_row(x.data() + r * K, xq.data() + static_cast<size_t>(r) * xrow, K);
  const std::vector<uint8_t> rw = repack16(qw.data(), row_bytes, N, nb);
  std::vector<float> out(static_cast<size_t>(N * R));
  gemm16(rw, N, nb, xq.data(), xrow, R, out.data());
  for (int64_t a = 0; a < R; ++a)  // the product's dot_act (the same numerics) gives the same bits
    for (int64_t r = 0; r < N; ++r)
      if (out[static_cast<size_t>(a * N + r)] != q->dot_act(qw.data() + static_cast<size_t>(r) * row_bytes,
                                                            xq.data() + static_cast<size_t>(a) * xrow, K)) {
        state.SkipWithError("tile differs from dot_act");
        return;
      }
  for (auto _ : state) {
    gemm16(rw, N, nb, xq.data(), xrow, R, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["Gmacs/s"] = benchmark::Counter(static_cast<double>(K * N * R) * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_Q41BlockInt)->Arg(1)->Arg(4)->Arg(16)->Arg(150)->MeasureProcessCPUTime();
