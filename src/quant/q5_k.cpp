// q5_K (ggml id 13): 256 elements in 176 bytes, { f16 d; f16 dmin; u8 scales[12]; u8 qh[32];
// u8 qs[128] } (ggml-common.h block_q5_K). As q4_K, plus a 5th bit: bit (2 c + h) of qh[l];
// value (d*sc) * q - (dmin*m), q in 0..31.
#include <algorithm>

#include "quant/k_scales.h"
#include "quant/k_act.h"
#include "quant/k_gemm_x86.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 256, kBytes = 176;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b), dmin = ld_f16(b + 2);
  const uint8_t *qh = b + 16, *q = b + 48;
  for (int c = 0; c < 4; ++c, q += 32)
    for (int h = 0; h < 2; ++h) {
      uint8_t sc, m;
      get_scale_min_k4(2 * c + h, b + 4, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      const int bit = 2 * c + h;
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> (4 * h)) & 0x0f) | (((qh[l] >> bit) & 1) << 4);
        *y++ = d1 * static_cast<float>(v) - m1;
      }
    }
}

void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    std::memset(b, 0, kBytes);
    uint8_t sc[8], mn[8];
    float d, dmin;
    quantize_scale_min(x, 31, b, b + 2, sc, mn, &d, &dmin);
    pack_scale_min_k4(sc, mn, b + 4);
    for (int s = 0; s < 8; ++s) {
      const float d1 = d * static_cast<float>(sc[s]), m1 = dmin * static_cast<float>(mn[s]);
      const int c = s / 2, h = s % 2;
      for (int l = 0; l < 32; ++l) {
        const int q = d1 > 0 ? std::clamp(nearest_int((x[32 * s + l] + m1) / d1), 0, 31) : 0;
        b[48 + 32 * c + l] |= static_cast<uint8_t>((q & 0x0f) << (4 * h));
        b[16 + l] |= static_cast<uint8_t>((q >> 4) << s);
      }
    }
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0, 2}); }

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)

// dot_act against q8_K (k_act.h): ggml_vec_dot_q5_K_q8_K's AVX2 arithmetic. The mins: the 4 lanes of
// q4_K (m[2l] * (bsums[4l] + bsums[4l+1]) + m[2l+1] * (..)) summed as integers, then per super-block
// summs = fma(-d_x * dmin, sum, summs) (ggml's `summs += dmin * sum`, contracted), added at the end.
[[gnu::always_inline]] inline float dot_act_spec(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  float acc[8] = {}, summs = 0;
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    const float dy = q8k_d(y);
    const float d = dy * ld_f16(p), dmin = -dy * ld_f16(p + 2);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) get_scale_min_k4(j, p + 4, &sc[j], &m[j]);
    int32_t msum = 0;
    for (int j = 0; j < 8; ++j) msum += m[j] * (q8k_bsum(y, 2 * j) + q8k_bsum(y, 2 * j + 1));
    summs = std::fma(dmin, static_cast<float>(msum), summs);
    int8_t q[256];
    int32_t sc16[16], sumi[8];
    for (int c = 0; c < 4; ++c)  // element 64 c + 32 h + l
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l)
          q[64 * c + 32 * h + l] =
              static_cast<int8_t>(((p[48 + 32 * c + l] >> (4 * h)) & 0x0f) | (((p[16 + l] >> (2 * c + h)) & 1) << 4));
    for (int g = 0; g < 16; ++g) sc16[g] = sc[g / 2];
    k_lanes(q, sc16, y, sumi);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(sumi[l]), acc[l]);
  }
  return hsum8(acc) + summs;
}

// The AVX2 kernels (k_act.h K4Block): nibbles plus the 5th bit (bit s of qh[l] for sub-block s).
MK_AVX2_FN inline void unpack_avx2(const uint8_t* p, K4Block& k) {
  k4_scales(p + 4, k);
  const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
  for (int c = 0; c < 4; ++c) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 48 + 32 * c));
    for (int h = 0; h < 2; ++h) {
      const int s = 2 * c + h;
      const __m256i lo = _mm256_and_si256(h ? _mm256_srli_epi16(bits, 4) : bits, _mm256_set1_epi8(0x0f));
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hb, s), _mm256_set1_epi8(1));
      k.q[s] = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
  }
}
MK_AVX2_FN inline int32_t hsum_i32x4(__m128i v) {
  v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
  return _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32(v, 1)));
}

MK_AVX2_FN float dot_act_avx2_hand(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  __m256 acc = _mm256_setzero_ps();
  float summs = 0;
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    const float dy = q8k_d(y);
    const float d = dy * ld_f16c(p), dmin = -dy * ld_f16c(p + 2);
    K4Block k;
    unpack_avx2(p, k);
    summs = std::fma(dmin, static_cast<float>(hsum_i32x4(k4_mins_lanes(k.mins, y))), summs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(k4_sumi(k, y)), acc);
  }
  return hsum_float_8(acc) + summs;
}
MK_QUANT_DOT_ACT_SPEC_HAND_AVX2(dot_act, dot_act_spec, dot_act_avx2_hand)

MK_QUANT_DOT_ACT4_K(dot_act4, KGemmKind::q5_K, dot_act)
MK_QUANT_GEMM_ACT_K(gemm_act, KGemmKind::q5_K, dot_act_generic, dot_act_avx2_hand)
}  // namespace

extern const QuantType kQ5_K = {DType::Q5_K, "q5_K", 13, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_KAct, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                dot_act4, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                     gemm_act_avx512vnni}};
}  // namespace mk::quant
