// q6_K (ggml id 14): 256 elements in 210 bytes, { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }
// (ggml-common.h block_q6_K). Element e (nb = e / 128, g = e % 128 / 32, l = e % 32): low 4 bits
// are the low (g < 2) or high (g >= 2) nibble of ql[64 nb + 32 (g % 2) + l], top 2 bits are bits
// 2g..2g+1 of qh[32 nb + l]; sub-block 8 nb + 2 g + l / 16; value (d*sc) * (q - 32).
#include <algorithm>

#include "quant/avx2.h"
#include "quant/k_act.h"
#include "quant/k_gemm_x86.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 256, kBytes = 210;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b + 208);
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int nb = 0; nb < 2; ++nb, y += 128) {  // ggml's loop order: 16 lanes of l share four scales
    const uint8_t *ql = b + 64 * nb, *qh = b + 128 + 32 * nb;
    for (int half = 0; half < 2; ++half) {
      const int is = 8 * nb + half;
      const float s0 = d * static_cast<float>(sc[is]), s1 = d * static_cast<float>(sc[is + 2]);
      const float s2 = d * static_cast<float>(sc[is + 4]), s3 = d * static_cast<float>(sc[is + 6]);
      for (int l = 16 * half; l < 16 * half + 16; ++l) {
        const int q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = s0 * static_cast<float>(q1);
        y[l + 32] = s1 * static_cast<float>(q2);
        y[l + 64] = s2 * static_cast<float>(q3);
        y[l + 96] = s3 * static_cast<float>(q4);
      }
    }
  }
}

void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    std::memset(b, 0, kBytes);
    float scale[16], big = 0;
    for (int s = 0; s < 16; ++s) {
      float a = 0, signed_max = 0;
      for (int l = 0; l < 16; ++l)
        if (std::fabs(x[16 * s + l]) > a) {
          a = std::fabs(x[16 * s + l]);
          signed_max = x[16 * s + l];
        }
      scale[s] = signed_max / -32;  // the largest value maps to q = -32
      big = std::max(big, std::fabs(scale[s]));
    }
    st_f16(b + 208, big / 127);
    const float d = ld_f16(b + 208);
    for (int s = 0; s < 16; ++s) {
      const int sc = d > 0 ? std::clamp(nearest_int(scale[s] / d), -128, 127) : 0;
      b[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(sc));
      const float ds = d * static_cast<float>(sc);
      const int nb = s / 8, g = s % 8 / 2;
      for (int k = 0; k < 16; ++k) {
        const int l = 16 * (s % 2) + k;
        const int q = (ds != 0 ? std::clamp(nearest_int(x[16 * s + k] / ds), -32, 31) : 0) + 32;
        b[64 * nb + 32 * (g % 2) + l] |= static_cast<uint8_t>((q & 0x0f) << (4 * (g / 2)));
        b[128 + 32 * nb + l] |= static_cast<uint8_t>((q >> 4) << (2 * g));
      }
    }
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {208}); }

MK_AVX2_FN float dot_avx2_hand(const void* w, const float* x, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const __m128i m4 = _mm_set1_epi8(0x0f), m3 = _mm_set1_epi8(0x03);
  const __m256i k32 = _mm256_set1_epi32(32);
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes) {
    const float d = ld_f16(p + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
    for (int nb = 0; nb < 2; ++nb) {
      const uint8_t *ql = p + 64 * nb, *qh = p + 128 + 32 * nb;
      const __m128i h0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh));
      const __m128i h1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16));
      for (int g = 0; g < 4; ++g, x += 32) {  // elements 32 g + l, l = 0..31
        const uint8_t* lq = ql + 32 * (g % 2);
        __m128i l0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lq));
        __m128i l1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lq + 16));
        if (g >= 2) {
          l0 = _mm_srli_epi16(l0, 4);
          l1 = _mm_srli_epi16(l1, 4);
        }
        const __m128i hs = _mm_cvtsi32_si128(2 * g);
        const __m128i q0 = _mm_or_si128(_mm_and_si128(l0, m4), _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(h0, hs), m3), 4));
        const __m128i q1 = _mm_or_si128(_mm_and_si128(l1, m4), _mm_slli_epi16(_mm_and_si128(_mm_srl_epi16(h1, hs), m3), 4));
        const __m256 s0 = _mm256_set1_ps(d * static_cast<float>(sc[8 * nb + 2 * g]));
        const __m256 s1 = _mm256_set1_ps(d * static_cast<float>(sc[8 * nb + 2 * g + 1]));
#define W8(s, v) _mm256_mul_ps(s, to_ps(_mm256_sub_epi32(v, k32)))  // ds * (q - 32)
        acc32(lo, hi, x, W8(s0, u8_lo(q0)), W8(s0, u8_hi(q0)), W8(s1, u8_lo(q1)), W8(s1, u8_hi(q1)));
      }
    }
  }
  return reduce16(lo, hi);
}
#undef W8

MK_QUANT_DOT_HAND_AVX2(dot, kQK, kBytes, dequant_block, dot_avx2_hand)

// dot_act against q8_K (k_act.h), the spec: ggml_vec_dot_q6_K_q8_K's AVX2 arithmetic (no minimum).
[[gnu::always_inline]] inline float dot_act_spec(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    const float d = q8k_d(y) * ld_f16(p + 208);
    int8_t q[256];
    int32_t sc16[16], sumi[8];
    for (int nb = 0; nb < 2; ++nb)  // element 128 nb + 32 g + l
      for (int g = 0; g < 4; ++g)
        for (int l = 0; l < 32; ++l) {
          const int lo = (p[64 * nb + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0f;
          q[128 * nb + 32 * g + l] = static_cast<int8_t>((lo | (((p[128 + 32 * nb + l] >> (2 * g)) & 3) << 4)) - 32);
        }
    for (int g = 0; g < 16; ++g) sc16[g] = static_cast<int8_t>(p[192 + g]);
    k_lanes(q, sc16, y, sumi);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(sumi[l]), acc[l]);
  }
  return hsum8(acc);
}

// Chunk c (elements 32 c .. 32 c + 31) of a block: the 6-bit integers (unsigned bytes) and the scales
// of its two groups of 16 as 16 x i16.
MK_AVX2_FN inline void chunk_avx2(const uint8_t* p, int c, __m256i& q, __m256i& sc) {
  const int nb = c / 4, g = c % 4;
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * nb + 32 * (g % 2)));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * nb));
  const __m256i l4 = _mm256_and_si256(g >= 2 ? _mm256_srli_epi16(lo, 4) : lo, _mm256_set1_epi8(0x0f));
  const __m256i h2 = _mm256_and_si256(_mm256_srli_epi16(hi, 2 * g), _mm256_set1_epi8(3));
  q = _mm256_or_si256(l4, _mm256_slli_epi16(h2, 4));
  const int8_t* s = reinterpret_cast<const int8_t*>(p + 192);
  sc = _mm256_set_m128i(_mm_set1_epi16(s[2 * c + 1]), _mm_set1_epi16(s[2 * c]));
}
// sc * ((q - 32) . y) in 8 int32 lanes: maddubs(q, y) - maddubs(32, y), then madd with the scales.
MK_AVX2_FN inline __m256i chunk_dot(__m256i q, __m256i sc, const uint8_t* qy) {
  const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qy));
  const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(_mm256_set1_epi8(32), y));
  return _mm256_madd_epi16(sc, p16);
}

MK_AVX2_FN float dot_act_avx2_hand(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    const float d = q8k_d(y) * ld_f16c(p + 208);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      __m256i q, sc;
      chunk_avx2(p, c, q, sc);
      sumi = _mm256_add_epi32(sumi, chunk_dot(q, sc, y + kQ8KQs + 32 * c));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_float_8(acc);
}
MK_QUANT_DOT_ACT_SPEC_HAND_AVX2(dot_act, dot_act_spec, dot_act_avx2_hand)

MK_QUANT_DOT_ACT4_K(dot_act4, KGemmKind::q6_K, dot_act)
MK_QUANT_GEMM_ACT_K(gemm_act, KGemmKind::q6_K, dot_act_generic, dot_act_avx2_hand)
}  // namespace

extern const QuantType kQ6_K = {DType::Q6_K, "q6_K", 14, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_KAct, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                dot_act4, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                     gemm_act_avx512vnni}};
}  // namespace mk::quant
