// q4_K (ggml id 12): 256 elements in 144 bytes, { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }
// (ggml-common.h block_q4_K). Eight sub-blocks of 32 with a 6-bit scale and a 6-bit min, packed as
// ggml's get_scale_min_k4. Element e (c = e / 64, h = e % 64 / 32, l = e % 32) is nibble h of
// qs[32 c + l], sub-block 2 c + h; value (d*sc) * q - (dmin*m).
#include <algorithm>

#include "quant/avx2.h"
#include "quant/k_act.h"
#include "quant/k_gemm_x86.h"
#include "quant/k_scales.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 256, kBytes = 144;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b), dmin = ld_f16(b + 2);
  const uint8_t* q = b + 16;
  for (int c = 0; c < 4; ++c, q += 32)
    for (int h = 0; h < 2; ++h) {
      uint8_t sc, m;
      get_scale_min_k4(2 * c + h, b + 4, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((q[l] >> (4 * h)) & 0x0f) - m1;
    }
}

void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    std::memset(b, 0, kBytes);
    uint8_t sc[8], mn[8];
    float d, dmin;
    quantize_scale_min(x, 15, b, b + 2, sc, mn, &d, &dmin);
    pack_scale_min_k4(sc, mn, b + 4);
    for (int s = 0; s < 8; ++s) {
      const float d1 = d * static_cast<float>(sc[s]), m1 = dmin * static_cast<float>(mn[s]);
      const int c = s / 2, h = s % 2;
      for (int l = 0; l < 32; ++l) {
        const int q = d1 > 0 ? std::clamp(nearest_int((x[32 * s + l] + m1) / d1), 0, 15) : 0;
        b[16 + 32 * c + l] |= static_cast<uint8_t>(q << (4 * h));
      }
    }
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0, 2}); }

MK_AVX2_FN float dot_avx2_hand(const void* w, const float* x, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const __m128i m4 = _mm_set1_epi8(0x0f);
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes) {
    const float d = ld_f16(p), dmin = ld_f16(p + 2);
    const uint8_t* q = p + 16;
    for (int c = 0; c < 4; ++c, q += 32) {
      const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
      const __m128i qb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16));
      for (int h = 0; h < 2; ++h, x += 32) {
        uint8_t sc, m;
        get_scale_min_k4(2 * c + h, p + 4, &sc, &m);
        const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sc)), m1 = _mm256_set1_ps(dmin * static_cast<float>(m));
        const __m128i a = h ? _mm_and_si128(_mm_srli_epi16(qa, 4), m4) : _mm_and_si128(qa, m4);
        const __m128i bb = h ? _mm_and_si128(_mm_srli_epi16(qb, 4), m4) : _mm_and_si128(qb, m4);
#define W8(v) _mm256_sub_ps(_mm256_mul_ps(d1, to_ps(v)), m1)  // d1 * q - m1
        acc32(lo, hi, x, W8(u8_lo(a)), W8(u8_hi(a)), W8(u8_lo(bb)), W8(u8_hi(bb)));
      }
    }
  }
  return reduce16(lo, hi);
}
#undef W8

MK_QUANT_DOT_HAND_AVX2(dot, kQK, kBytes, dequant_block, dot_avx2_hand)

// dot_act against q8_K (k_act.h), the spec: ggml_vec_dot_q4_K_q8_K's AVX2 arithmetic. The mins go
// into 4 lanes of their own: lane l = m[2l] * (bsums[4l] + bsums[4l+1]) + m[2l+1] * (bsums[4l+2] +
// bsums[4l+3]) (the sums over sub-blocks 2l and 2l+1), acc_m[l] = fma(-d_x * dmin, lane, acc_m[l]),
// added after hsum_float_8 as (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]).
[[gnu::always_inline]] inline float dot_act_spec(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  float acc[8] = {}, acc_m[4] = {};
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    const float dy = q8k_d(y);
    const float d = dy * ld_f16(p), dmin = -dy * ld_f16(p + 2);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) get_scale_min_k4(j, p + 4, &sc[j], &m[j]);
    for (int l = 0; l < 4; ++l) {
      const int32_t s0 = q8k_bsum(y, 4 * l) + q8k_bsum(y, 4 * l + 1), s1 = q8k_bsum(y, 4 * l + 2) + q8k_bsum(y, 4 * l + 3);
      acc_m[l] = std::fma(dmin, static_cast<float>(m[2 * l] * s0 + m[2 * l + 1] * s1), acc_m[l]);
    }
    int8_t q[256];
    int32_t sc16[16], sumi[8];
    for (int c = 0; c < 4; ++c)  // element 64 c + 32 h + l
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) q[64 * c + 32 * h + l] = static_cast<int8_t>((p[16 + 32 * c + l] >> (4 * h)) & 0x0f);
    for (int g = 0; g < 16; ++g) sc16[g] = sc[g / 2];
    k_lanes(q, sc16, y, sumi);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(sumi[l]), acc[l]);
  }
  return hsum8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
}

MK_AVX2_FN inline void unpack_avx2(const uint8_t* p, K4Block& k) {
  k4_scales(p + 4, k);
  for (int c = 0; c < 4; ++c) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * c));
    k.q[2 * c] = _mm256_and_si256(bits, _mm256_set1_epi8(0x0f));
    k.q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), _mm256_set1_epi8(0x0f));
  }
}
MK_AVX2_FN inline float finish(__m256 acc, __m128 acc_m) {
  acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
  acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
  return hsum_float_8(acc) + _mm_cvtss_f32(acc_m);
}

MK_AVX2_FN float dot_act_avx2_hand(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    const float dy = q8k_d(y);
    const float d = dy * ld_f16c(p), dmin = -dy * ld_f16c(p + 2);
    K4Block k;
    unpack_avx2(p, k);
    acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins_lanes(k.mins, y)), acc_m);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(k4_sumi(k, y)), acc);
  }
  return finish(acc, acc_m);
}
MK_QUANT_DOT_ACT_SPEC_HAND_AVX2(dot_act, dot_act_spec, dot_act_avx2_hand)

MK_QUANT_DOT_ACT4_K(dot_act4, KGemmKind::q4_K, dot_act)
MK_QUANT_GEMM_ACT_K(gemm_act, KGemmKind::q4_K, dot_act_generic, dot_act_avx2_hand)
}  // namespace

extern const QuantType kQ4_K = {DType::Q4_K, "q4_K", 12, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_KAct, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                dot_act4, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                     gemm_act_avx512vnni}};
}  // namespace mk::quant
