// iq4_nl (ggml id 20): 32 elements in 18 bytes, { f16 d; u8 qs[16] }; element j < 16 is the low
// nibble of qs[j], element j + 16 its high nibble, each an index into the non-linear table
// kvalues_iq4nl; value d * kvalues_iq4nl[q] (ggml-common.h block_iq4_nl). llama.cpp's quantizer
// writes it for the rows of a Q2_K, Q3_K_* or IQ4_XS file that are not whole 256-element
// super-blocks (SmolLM2's 576-wide rows, for one).
#include <algorithm>
#include <cmath>

#include <vector>

#include "quant/avx2.h"
#include "quant/gemm_x86.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 32, kBytes = 18;
constexpr const int8_t* kValues = kValuesIq4nl;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kValues[qs[j] & 0x0f]);
    y[j + 16] = d * static_cast<float>(kValues[qs[j] >> 4]);
  }
}

// Round to the nearest table entry under d = (value of largest magnitude) / -127 (ggml
// quantize_row_iq4_nl_ref's starting point), then d refit by least squares to those entries; ggml
// also searches a few scales around the first one (same layout, somewhat smaller error).
void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    const float max = max_by_magnitude(x, kQK);
    int q[kQK] = {};
    float d = 0;
    if (max != 0) {
      const float id = static_cast<float>(kValues[0]) / max;
      double sxq = 0, sqq = 0;
      for (int j = 0; j < kQK; ++j) {
        q[j] = nearest_iq4nl_index(x[j] * id);
        sxq += static_cast<double>(x[j]) * kValues[q[j]];
        sqq += static_cast<double>(kValues[q[j]]) * kValues[q[j]];
      }
      d = sqq > 0 ? static_cast<float>(sxq / sqq) : 0.0f;
    }
    st_f16(b, d);
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0}); }

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)

// dot_act against q8_0 activations with the numerics of ggml_vec_dot_iq4_nl_q8_0 (AVX2,
// arch/x86/quants.c): blocks in pairs, each block's integer products summed in 8 int32 lanes (lane
// l = elements 4l..4l+3), the even block of a pair into one accumulator and the odd into another,
// acc[l] = fma(d_w * d_x, float(lane sum), acc[l]); hsum_float_8 of their sum; a last unpaired block
// added after that as d_w * d_x * (its integer dot).
[[gnu::always_inline]] inline float dot_act_spec(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  const int64_t nb = n / kQK;
  float acc[2][8] = {};
  const auto lanes = [](const uint8_t* blk, const uint8_t* yb, int32_t* s) {
    const int8_t* qy = reinterpret_cast<const int8_t*>(yb + 2);
    for (int l = 0; l < 8; ++l) {
      s[l] = 0;
      for (int e = 4 * l; e < 4 * l + 4; ++e) {
        const int nib = e < 16 ? blk[2 + e] & 0x0f : blk[2 + e - 16] >> 4;
        s[l] += static_cast<int32_t>(kValues[nib]) * static_cast<int32_t>(qy[e]);
      }
    }
  };
  int64_t b = 0;
  for (; b + 1 < nb; b += 2)
    for (int k = 0; k < 2; ++k) {
      const uint8_t* blk = p + (b + k) * kBytes;
      const uint8_t* yb = y + (b + k) * 34;
      int32_t s[8];
      lanes(blk, yb, s);
      const float dd = ld_f16(yb) * ld_f16(blk);
      for (int l = 0; l < 8; ++l) acc[k][l] = std::fma(dd, static_cast<float>(s[l]), acc[k][l]);
    }
  float sum8[8];
  for (int l = 0; l < 8; ++l) sum8[l] = acc[0][l] + acc[1][l];
  float r = hsum8(sum8);
  if (b < nb) {
    int32_t s[8];
    lanes(p + b * kBytes, y + b * 34, s);
    const int32_t total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    r += ld_f16(p + b * kBytes) * ld_f16(y + b * 34) * static_cast<float>(total);
  }
  return r;
}

// The same with AVX2, as ggml's: a block's 32 weights looked up in the table with vpshufb (low
// nibbles -> elements 0..15, high -> 16..31), |w| times y with w's sign (vpmaddubsw: at most
// 2 x 127 x 127 per int16, exact), pairs to int32 lanes (vpmaddwd with ones), one fma per block into
// the even or odd accumulator. NA activation rows share each block's lookup (dot_act4: NA = 4).
template <int NA>
MK_AVX2_FN inline void dot_act_rows_avx2(const uint8_t* p, const uint8_t* const* y, int64_t n, float* out) {
  const int64_t nb = n / kQK;
  const __m128i values = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kValues));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NA][2];
  for (int a = 0; a < NA; ++a) acc[a][0] = acc[a][1] = _mm256_setzero_ps();
  const auto lanes = [&](const uint8_t* yb, __m256i w, __m256i aw) {
    const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb + 2));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(yv, w)), ones);
  };
  const auto weights = [&](const uint8_t* blk, __m256i* w, __m256i* aw) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    *w = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q, 4), m4)),
                          _mm_shuffle_epi8(values, _mm_and_si128(q, m4)));
    *aw = _mm256_sign_epi8(*w, *w);
  };
  int64_t b = 0;
  for (; b + 1 < nb; b += 2)
    for (int k = 0; k < 2; ++k) {
      const uint8_t* blk = p + (b + k) * kBytes;
      __m256i w, aw;
      weights(blk, &w, &aw);
      const float dw = ld_f16c(blk);
      for (int a = 0; a < NA; ++a) {
        const uint8_t* yb = y[a] + (b + k) * 34;
        const __m256 dd = _mm256_set1_ps(ld_f16c(yb) * dw);
        acc[a][k] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(lanes(yb, w, aw)), acc[a][k]);
      }
    }
  for (int a = 0; a < NA; ++a) {
    float r = hsum_float_8(_mm256_add_ps(acc[a][0], acc[a][1]));
    if (b < nb) {  // the unpaired last block: its exact integer dot, one multiply-add
      const uint8_t* blk = p + b * kBytes;
      const uint8_t* yb = y[a] + b * 34;
      __m256i w, aw;
      weights(blk, &w, &aw);
      alignas(32) int32_t s[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(s), lanes(yb, w, aw));
      const int32_t total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
      r += ld_f16c(blk) * ld_f16c(yb) * static_cast<float>(total);
    }
    out[a] = r;
  }
}
MK_AVX2_FN float dot_act_avx2_hand(const void* w, const void* xq, int64_t n) {
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  float r;
  dot_act_rows_avx2<1>(static_cast<const uint8_t*>(w), &y, n, &r);
  return r;
}
MK_AVX2_FN void dot_act4_avx2(const void* w, const void* const* xq, int64_t n, float* out) {
  const uint8_t* y[4] = {static_cast<const uint8_t*>(xq[0]), static_cast<const uint8_t*>(xq[1]),
                         static_cast<const uint8_t*>(xq[2]), static_cast<const uint8_t*>(xq[3])};
  dot_act_rows_avx2<4>(static_cast<const uint8_t*>(w), y, n, out);
}

MK_QUANT_DOT_ACT_SPEC_HAND_AVX2(dot_act, dot_act_spec, dot_act_avx2_hand)
MK_QUANT_DOT_ACT4_HAND_AVX2(dot_act4, dot_act, dot_act4_avx2)

// ---- gemm_act. AVX2 / AVX-VNNI: dot_act4 per weight row and four activation rows (each weight block
// looked up once for the four), dot_act for the last na % 4.
MK_AVX2_FN void gemm_act_avx2(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,
                              float* out, int64_t ldo) {
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  const uint8_t* xb = static_cast<const uint8_t*>(x);
  for (int64_t i = 0; i < nw; ++i) {
    const uint8_t* wr = wb + static_cast<size_t>(i) * ws;
    int64_t a = 0;
    for (; a + 4 <= na; a += 4) {
      const uint8_t* y[4] = {xb + a * xs, xb + (a + 1) * xs, xb + (a + 2) * xs, xb + (a + 3) * xs};
      float r[4];
      dot_act_rows_avx2<4>(wr, y, n, r);
      for (int k = 0; k < 4; ++k) out[(a + k) * ldo + i] = r[k];
    }
    for (; a < na; ++a) {
      const uint8_t* y = xb + a * xs;
      dot_act_rows_avx2<1>(wr, &y, n, out + a * ldo + i);
    }
  }
}
void gemm_act_avxvnni(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,
                      float* out, int64_t ldo) {
  gemm_act_avx2(w, ws, nw, x, xs, na, n, out, ldo);
}

// AVX-512 VNNI: a register holds one weight row's pair of blocks (2p, 2p + 1): its 64 table values
// plus 128 (unsigned bytes; the table lookup is vpshufb within each 128-bit lane: low nibbles of
// block 2p, its high nibbles, then block 2p + 1's), so vpdpbusd against the pair's 64 activation
// quants, started from -128 * sum4(y) per lane, gives both blocks' 8 exact int32 lane sums, and
// the accumulator's low half is ggml's even-block accumulator, its high half the odd one:
// acc = fma([d_w d_x of block 2p x 8 | of block 2p + 1 x 8], float(lane sums), acc). At the end
// hsum_float_8(low + high), plus an unpaired last block as dot_act adds it. NR weight rows x NA
// activation rows (NR * NA <= 16 accumulators) from per-call tables, [pair][row] for a chunk of NA
// rows: the pair's 64 quants (yq), -128 * sum4 per lane (yc, 16 int32) and d_x per lane (ydx, 16
// floats), all plain loads.
alignas(16) constexpr uint8_t kValuesU[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
static_assert(kValuesU[0] == kValues[0] + 128 && kValuesU[15] == kValues[15] + 128);

struct alignas(64) Unit64 {
  uint8_t bytes[64];
};

template <int NR, int NA>
MK_AVX512VNNI_FN inline void gemm_tile512(const uint8_t* const* w, const Unit64* yq, const Unit64* yc, const Unit64* ydx,
                                          int64_t np, float* out) {
  const __m512i table = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kValuesU)));
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  constexpr long long kS = 0x0004000400040004;  // vpsrlvw counts: 128-bit lanes 1 and 3 take the high nibbles
  const __m512i shifts = _mm512_set_epi64(kS, kS, 0, 0, kS, kS, 0, 0);
  const __m512i spread = _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0);
  __m512 acc[NR][NA];
  for (int r = 0; r < NR; ++r)
    for (int a = 0; a < NA; ++a) acc[r][a] = _mm512_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    __m512i u[NR];
    __m512 dw[NR];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* b0 = w[r] + 2 * p * kBytes;
      const __m256i q = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + kBytes + 2)),
                                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 2)));
      const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi64(spread, _mm512_castsi256_si512(q)), shifts), m4);
      u[r] = _mm512_shuffle_epi8(table, nib);
      dw[r] = _mm512_cvtph_ps(_mm256_mask_set1_epi16(_mm256_set1_epi16(static_cast<short>(ld_u16(b0))), 0xff00,
                                                     static_cast<short>(ld_u16(b0 + kBytes))));
    }
    for (int a = 0; a < NA; ++a) {
      const int64_t k = p * NA + a;
      const __m512i qy = _mm512_load_si512(yq + k);
      const __m512i c = _mm512_load_si512(yc + k);
      const __m512 dx = _mm512_load_ps(ydx + k);
      for (int r = 0; r < NR; ++r)
        acc[r][a] = _mm512_fmadd_ps(_mm512_mul_ps(dw[r], dx), _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c, u[r], qy)), acc[r][a]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int a = 0; a < NA; ++a) {
      const __m256 lo = _mm512_castps512_ps256(acc[r][a]);
      const __m256 hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(acc[r][a], acc[r][a], 0x4e));
      out[r * NA + a] = hsum_float_8(_mm256_add_ps(lo, hi));
    }
}

// The exact integer dot of one weight block and one q8_0 activation block.
inline int32_t block_int_dot(const uint8_t* blk, const uint8_t* yb) {
  const int8_t* qy = reinterpret_cast<const int8_t*>(yb + 2);
  int32_t s = 0;
  for (int j = 0; j < 16; ++j)
    s += static_cast<int32_t>(kValues[blk[2 + j] & 0x0f]) * qy[j] + static_cast<int32_t>(kValues[blk[2 + j] >> 4]) * qy[j + 16];
  return s;
}

using Tile512 = void (*)(const uint8_t* const*, const Unit64*, const Unit64*, const Unit64*, int64_t, float*);
template <int NR, int NA>
MK_AVX512VNNI_FN void tile512_fn(const uint8_t* const* w, const Unit64* yq, const Unit64* yc, const Unit64* ydx,
                                 int64_t np, float* out) {
  gemm_tile512<NR, NA>(w, yq, yc, ydx, np, out);
}

// Activation rows packed once per call in chunks of up to 8; weight rows in groups of 4 (the last
// padded by repeating its last row): 4 x NA tiles for chunks of up to 4 rows, two 2 x NA tiles for
// wider ones.
MK_AVX512VNNI_FN void gemm_act_avx512vnni(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na,
                                          int64_t n, float* out, int64_t ldo) {
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  const uint8_t* xb = static_cast<const uint8_t*>(x);
  const int64_t nb = n / kQK, np = nb / 2;
  const size_t n_t = static_cast<size_t>(np * na);
  thread_local std::vector<Unit64> tables;  // quants, corrections, scales: n_t units each
  if (tables.size() < 3 * n_t) tables.resize(3 * n_t);
  Unit64* yq = tables.data();
  Unit64* yc = yq + n_t;
  Unit64* ydx = yc + n_t;
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t a0 = 0; a0 < na; a0 += 8) {
    const int64_t cols = std::min<int64_t>(8, na - a0);
    for (int64_t p = 0; p < np; ++p)
      for (int64_t a = 0; a < cols; ++a) {
        const uint8_t* y0 = xb + static_cast<size_t>(a0 + a) * xs + static_cast<size_t>(2 * p) * 34;
        const __m512i qy = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y0 + 2))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y0 + 34 + 2)), 1);
        const int64_t k = a0 * np + p * cols + a;  // [chunk][pair][row]
        _mm512_store_si512(yq + k, qy);
        _mm512_store_si512(yc + k, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, qy)));
        _mm512_store_ps(ydx + k, _mm512_insertf32x8(_mm512_set1_ps(ld_f16c(y0)), _mm256_set1_ps(ld_f16c(y0 + 34)), 1));
      }
  }
  constexpr Tile512 tiles4[4] = {tile512_fn<4, 1>, tile512_fn<4, 2>, tile512_fn<4, 3>, tile512_fn<4, 4>};
  constexpr Tile512 tiles2[4] = {tile512_fn<2, 5>, tile512_fn<2, 6>, tile512_fn<2, 7>, tile512_fn<2, 8>};
  for (int64_t i0 = 0; i0 < nw; i0 += 4) {
    const int rows = static_cast<int>(std::min<int64_t>(4, nw - i0));
    const uint8_t* wr[4];
    for (int i = 0; i < 4; ++i) wr[i] = wb + static_cast<size_t>(i0 + std::min(i, rows - 1)) * ws;
    prefetch_bytes(wr[0] + 8 * ws, 4 * ws);  // the group after next
    for (int64_t a0 = 0; a0 < na; a0 += 8) {
      const int cols = static_cast<int>(std::min<int64_t>(8, na - a0));
      const int64_t k0 = a0 * np;
      float t[4 * 8];
      if (cols <= 4) {
        tiles4[cols - 1](wr, yq + k0, yc + k0, ydx + k0, np, t);
      } else {
        tiles2[cols - 5](wr, yq + k0, yc + k0, ydx + k0, np, t);
        tiles2[cols - 5](wr + 2, yq + k0, yc + k0, ydx + k0, np, t + 2 * cols);
      }
      for (int i = 0; i < rows; ++i)
        for (int a = 0; a < cols; ++a) {
          float r = t[i * cols + a];
          if (nb % 2 != 0) {  // the unpaired last block: its exact integer dot, one multiply-add
            const uint8_t* blk = wr[i] + (nb - 1) * kBytes;
            const uint8_t* yb = xb + static_cast<size_t>(a0 + a) * xs + static_cast<size_t>(nb - 1) * 34;
            r += ld_f16c(blk) * ld_f16c(yb) * static_cast<float>(block_int_dot(blk, yb));
          }
          out[(a0 + a) * ldo + i0 + i] = r;
        }
    }
  }
}
MK_QUANT_GEMM_GENERIC_AND_PICK(gemm_act, dot_act_generic, gemm_act_avx512vnni)
}  // namespace

extern const QuantType kIQ4_NL = {DType::IQ4_NL, "iq4_nl", 20, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                  quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                  &kQ8_0Act, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512}, dot_act4,
                                  gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                             gemm_act_avx512vnni}};
}  // namespace mk::quant
