// q2_K (ggml id 10): 256 elements in 84 bytes, { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin }
// (ggml-common.h block_q2_K). Sixteen sub-blocks of 16: scales[i] low nibble is the scale, high
// nibble the min. Element e (nb = e / 128, j = e % 128 / 32, h = e % 32 / 16, l = e % 16) is bits
// 2j..2j+1 of qs[32 nb + 16 h + l] with sub-block 8 nb + 2 j + h; value (d*sc) * q - (dmin*m).
#include <algorithm>

#include "quant/k_act.h"
#include "quant/k_gemm_x86.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 256, kBytes = 84;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b + 80), dmin = ld_f16(b + 82);
  const uint8_t* q = b + 16;
  int is = 0;
  for (int n = 0; n < kQK; n += 128, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int h = 0; h < 2; ++h) {
        const uint8_t sc = b[is++];
        const float dl = d * static_cast<float>(sc & 0x0f), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[16 * h + l] >> shift) & 3) - ml;
      }
}

void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    std::memset(b, 0, kBytes);
    float scale[16], mins[16], max_scale = 0, max_min = 0;
    for (int s = 0; s < 16; ++s) {
      float mn = 0, mx = x[16 * s];
      for (int l = 0; l < 16; ++l) {
        mn = std::min(mn, x[16 * s + l]);
        mx = std::max(mx, x[16 * s + l]);
      }
      scale[s] = (mx - mn) / 3;
      mins[s] = -mn;
      max_scale = std::max(max_scale, scale[s]);
      max_min = std::max(max_min, mins[s]);
    }
    st_f16(b + 80, max_scale / 15);
    st_f16(b + 82, max_min / 15);
    const float d = ld_f16(b + 80), dmin = ld_f16(b + 82);
    for (int s = 0; s < 16; ++s) {
      const int sc = d > 0 ? std::clamp(nearest_int(scale[s] / d), 0, 15) : 0;
      const int m = dmin > 0 ? std::clamp(nearest_int(mins[s] / dmin), 0, 15) : 0;
      b[s] = static_cast<uint8_t>(sc | (m << 4));
      const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
      const int nb = s / 8, j = s % 8 / 2, h = s % 2;
      for (int l = 0; l < 16; ++l) {
        const int q = dl > 0 ? std::clamp(nearest_int((x[16 * s + l] + ml) / dl), 0, 3) : 0;
        b[16 + 32 * nb + 16 * h + l] |= static_cast<uint8_t>(q << (2 * j));
      }
    }
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {80, 82}); }

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)

// dot_act against q8_K (k_act.h): ggml_vec_dot_q2_K_q8_K's AVX2 arithmetic. The mins share the 8
// lanes, first: lane l = m[2l] * bsums[2l] + m[2l+1] * bsums[2l+1], acc[l] = fma(-d_x * dmin, lane,
// acc[l]), then acc[l] = fma(d_x * d, sumi[l], acc[l]).
[[gnu::always_inline]] inline float dot_act_spec(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    const float dy = q8k_d(y);
    const float d = dy * ld_f16(p + 80), dmin = -dy * ld_f16(p + 82);
    for (int l = 0; l < 8; ++l) {
      const int32_t lane = (p[2 * l] >> 4) * q8k_bsum(y, 2 * l) + (p[2 * l + 1] >> 4) * q8k_bsum(y, 2 * l + 1);
      acc[l] = std::fma(dmin, static_cast<float>(lane), acc[l]);
    }
    int8_t q[256];
    int32_t sc16[16], sumi[8];
    for (int nb = 0; nb < 2; ++nb)  // element 128 nb + 32 j + l
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) q[128 * nb + 32 * j + l] = static_cast<int8_t>((p[16 + 32 * nb + l] >> (2 * j)) & 3);
    for (int g = 0; g < 16; ++g) sc16[g] = p[g] & 0x0f;
    k_lanes(q, sc16, y, sumi);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(sumi[l]), acc[l]);
  }
  return hsum8(acc);
}

// The same with AVX2, chunk by chunk (32 elements, the groups 2c and 2c+1).
MK_AVX2_FN float dot_act_avx2_hand(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    const float dy = q8k_d(y);
    const float d = dy * ld_f16c(p + 80), dmin = -dy * ld_f16c(p + 82);
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0f)));
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + kQ8KBsums));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bs)), acc);
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * (c / 4)));
      const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * (c % 4)), _mm256_set1_epi8(3));
      const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(p[2 * c + 1] & 0x0f), _mm_set1_epi16(p[2 * c] & 0x0f));
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + kQ8KQs + 32 * c));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(sc, _mm256_maddubs_epi16(q, qy)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_float_8(acc);
}
MK_QUANT_DOT_ACT_SPEC_HAND_AVX2(dot_act, dot_act_spec, dot_act_avx2_hand)
MK_QUANT_DOT_ACT4_K(dot_act4, KGemmKind::q2_K, dot_act)
MK_QUANT_GEMM_ACT_K(gemm_act, KGemmKind::q2_K, dot_act_generic, dot_act_avx2_hand)
}  // namespace

extern const QuantType kQ2_K = {DType::Q2_K, "q2_K", 10, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_KAct, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                dot_act4, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                     gemm_act_avx512vnni}};
}  // namespace mk::quant
