// iq4_nl (ggml id 20): 32 elements in 18 bytes, { f16 d; u8 qs[16] }; element j < 16 is the low
// nibble of qs[j], element j + 16 its high nibble, each an index into the non-linear table
// kvalues_iq4nl; value d * kvalues_iq4nl[q] (ggml-common.h block_iq4_nl). llama.cpp's quantizer
// writes it for the rows of a Q2_K, Q3_K_* or IQ4_XS file that are not whole 256-element
// super-blocks (SmolLM2's 576-wide rows, for one).
#include <algorithm>
#include <cmath>

#include "quant/avx2.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 32, kBytes = 18;
constexpr int8_t kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kValues[qs[j] & 0x0f]);
    y[j + 16] = d * static_cast<float>(kValues[qs[j] >> 4]);
  }
}

// The table index nearest to v (ties to the lower index).
inline int nearest_index(float v) {
  int best = 0;
  for (int i = 1; i < 16; ++i)
    if (std::fabs(v - static_cast<float>(kValues[i])) < std::fabs(v - static_cast<float>(kValues[best]))) best = i;
  return best;
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
        q[j] = nearest_index(x[j] * id);
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
}  // namespace

// No gemm_act yet: the CPU interpreter takes dot_act4 / dot_act per weight row for these rows
// (kernels.cpp), the same bits.
extern const QuantType kIQ4_NL = {DType::IQ4_NL, "iq4_nl", 20, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                  quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                  &kQ8_0Act, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512}, dot_act4};
}  // namespace mk::quant
