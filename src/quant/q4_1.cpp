// q4_1 (ggml id 3): 32 elements in 20 bytes, { f16 d; f16 m; u8 qs[16] }; nibbles as q4_0; value
// d * q + m (ggml-common.h block_q4_1).
#include <algorithm>

#include "quant/avx2.h"
#include "quant/gemm_x86.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 32, kBytes = 20;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b), m = ld_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// ggml quantize_row_q4_1_ref: d = (max - min) / 15, m = min.
void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < kQK; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float d = (mx - mn) / 15, id = d != 0 ? 1.0f / d : 0.0f;
    st_f16(b, d);
    st_f16(b + 2, mn);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - mn) * id + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - mn) * id + 0.5f)));
      b[4 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0, 2}); }

MK_AVX2_FN float dot_avx2_hand(const void* w, const float* x, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const __m128i m4 = _mm_set1_epi8(0x0f);
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, x += kQK) {
    const __m256 d = _mm256_set1_ps(ld_f16(p)), m = _mm256_set1_ps(ld_f16(p + 2));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4));
    const __m128i ql = _mm_and_si128(q, m4), qh = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
#define W8(v) _mm256_add_ps(_mm256_mul_ps(d, to_ps(v)), m)  // d * q + m
    acc32(lo, hi, x, W8(u8_lo(ql)), W8(u8_hi(ql)), W8(u8_lo(qh)), W8(u8_hi(qh)));
  }
  return reduce16(lo, hi);
}
#undef W8

MK_QUANT_DOT_HAND_AVX2(dot, kQK, kBytes, dequant_block, dot_avx2_hand)

// Integer block for dot_act: q, d and m.
inline void unpack_block(const uint8_t* b, int8_t* q, float* d, float* m) {
  *d = ld_f16(b);
  *m = ld_f16(b + 2);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(b[4 + j] & 0x0f);
    q[j + 16] = static_cast<int8_t>(b[4 + j] >> 4);
  }
}

// ggml_vec_dot_q4_1_q8_1, AVX2 path.
MK_AVX2_FN float dot_act_avx2_hand(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  __m256 acc = _mm256_setzero_ps();
  float summs = 0;
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += 36) {
    summs = std::fma(ld_f16c(p + 2), ld_f16c(y + 2), summs);
    const __m256 d = _mm256_set1_ps(ld_f16c(p) * ld_f16c(y));
    const __m256i qx = bytes_from_nibbles_32(p + 4);
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 4));
    acc = _mm256_fmadd_ps(d, mul_sum_us8_pairs_float(qx, qy), acc);
  }
  return hsum_float_8(acc) + summs;
}
MK_QUANT_DOT_ACT_HAND_AVX2(dot_act, kBytes, unpack_block, true, dot_act_avx2_hand)

// dot_act_avx2_hand against four activation rows, each weight block unpacked once.
MK_AVX2_FN void dot_act4_avx2_hand(const void* w, const void* const* xq, int64_t n, float* out) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y[4];
  __m256 acc[4];
  float summs[4];
  for (int r = 0; r < 4; ++r) {
    y[r] = static_cast<const uint8_t*>(xq[r]);
    acc[r] = _mm256_setzero_ps();
    summs[r] = 0;
  }
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes) {
    const float dw = ld_f16c(p), mw = ld_f16c(p + 2);
    const __m256i qx = bytes_from_nibbles_32(p + 4);
    for (int r = 0; r < 4; ++r) {
      const uint8_t* yb = y[r] + b * 36;
      summs[r] = std::fma(mw, ld_f16c(yb + 2), summs[r]);
      const __m256 d = _mm256_set1_ps(dw * ld_f16c(yb));
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb + 4));
      acc[r] = _mm256_fmadd_ps(d, mul_sum_us8_pairs_float(qx, qy), acc[r]);
    }
  }
  for (int r = 0; r < 4; ++r) out[r] = hsum_float_8(acc[r]) + summs[r];
}
MK_QUANT_DOT_ACT4_HAND_AVX2(dot_act4, dot_act, dot_act4_avx2_hand)
MK_QUANT_GEMM_ACT(gemm_act, GemmKind::q4_1, dot_act_generic)
}  // namespace

extern const QuantType kQ4_1 = {DType::Q4_1, "q4_1", 3, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_1Act, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                dot_act4, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni}};
}  // namespace mk::quant
