// q3_K (ggml id 11): 256 elements in 110 bytes, { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }
// (ggml-common.h block_q3_K). Sixteen sub-blocks of 16 with 6-bit scales stored minus 32: scale k's
// low 4 bits are the low (k < 8) or high (k >= 8) nibble of scales[k % 8], its top 2 bits are bits
// 2 (k / 4)..+1 of scales[8 + k % 4]. Element e (nb, j, h, l as q2_K) has low bits 2j..2j+1 of
// qs[32 nb + 16 h + l] and high bit (4 nb + j) of hmask[16 h + l]; value (d*(sc-32)) * (q - 4) where
// q = low | high << 2 (a clear high bit subtracts 4).
#include <algorithm>

#include "quant/k_act.h"
#include "quant/k_gemm_x86.h"
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 256, kBytes = 110;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b + 108);
  const uint8_t *hm = b, *q = b + 32, *sc = b + 96;
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < kQK; n += 128, q += 32)
    for (int shift = 0; shift < 8; shift += 2, m = static_cast<uint8_t>(m << 1))
      for (int h = 0; h < 2; ++h) {
        const float dl = d * static_cast<float>(scale6(sc, is++));
        for (int l = 0; l < 16; ++l) {
          const int v = ((q[16 * h + l] >> shift) & 3) - ((hm[16 * h + l] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
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
      scale[s] = signed_max / -4;  // the largest value maps to q = -4, the most negative code
      if (std::fabs(scale[s]) > std::fabs(big)) big = scale[s];
    }
    st_f16(b + 108, big / -32);
    const float d = ld_f16(b + 108);
    for (int s = 0; s < 16; ++s) {
      const int sc = d != 0 ? std::clamp(nearest_int(scale[s] / d), -32, 31) : 0;
      const int u = sc + 32;
      if (s < 8) b[96 + s] |= static_cast<uint8_t>(u & 0x0f);
      else b[96 + s - 8] |= static_cast<uint8_t>((u & 0x0f) << 4);
      b[96 + 8 + s % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (s / 4)));
      const float dl = d * static_cast<float>(sc);
      const int nb = s / 8, j = s % 8 / 2, h = s % 2;
      for (int l = 0; l < 16; ++l) {
        const int q = dl != 0 ? std::clamp(nearest_int(x[16 * s + l] / dl), -4, 3) + 4 : 4;
        b[32 + 32 * nb + 16 * h + l] |= static_cast<uint8_t>((q & 3) << (2 * j));
        if (q & 4) b[16 * h + l] |= static_cast<uint8_t>(1u << (4 * nb + j));
      }
    }
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {108}); }

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)

// dot_act against q8_K (k_act.h): ggml_vec_dot_q3_K_q8_K's AVX2 arithmetic (no minimum; a clear
// high bit subtracts 4 from the integer).
[[gnu::always_inline]] inline float dot_act_spec(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  float acc[8] = {};
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    const float d = q8k_d(y) * ld_f16(p + 108);
    int8_t q[256];
    int32_t sc16[16], sumi[8];
    for (int c = 0; c < 8; ++c)  // element 32 c + l: low bits in qs, high bit c of hmask[l]
      for (int l = 0; l < 32; ++l) {
        const int lo = (p[32 + 32 * (c / 4) + l] >> (2 * (c % 4))) & 3;
        q[32 * c + l] = static_cast<int8_t>(lo - 4 + 4 * ((p[l] >> c) & 1));
      }
    for (int g = 0; g < 16; ++g) sc16[g] = scale6(p + 96, g);
    k_lanes(q, sc16, y, sumi);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(sumi[l]), acc[l]);
  }
  return hsum8(acc);
}

// The same with AVX2, chunk by chunk (32 elements, the groups 2c and 2c+1): maddubs(low bits, y)
// minus maddubs(4 where the high bit is clear, y), as ggml does, then the scales.
MK_AVX2_FN float dot_act_avx2_hand(const void* w, const void* xq, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  const uint8_t* y = static_cast<const uint8_t*>(xq);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK; ++b, p += kBytes, y += kQ8KBytes) {
    const float d = q8k_d(y) * ld_f16c(p + 108);
    int16_t sc[16];
    for (int g = 0; g < 16; ++g) sc[g] = static_cast<int16_t>(scale6(p + 96, g));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    __m256i sumi = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * (c / 4)));
      const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * (c % 4)), _mm256_set1_epi8(3));
      const __m256i clear = _mm256_andnot_si256(_mm256_srli_epi16(hb, c), _mm256_set1_epi8(1));
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + kQ8KQs + 32 * c));
      const __m256i p16 =
          _mm256_sub_epi16(_mm256_maddubs_epi16(lo, qy), _mm256_maddubs_epi16(_mm256_slli_epi16(clear, 2), qy));
      const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * c + 1]), _mm_set1_epi16(sc[2 * c]));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p16));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum_float_8(acc);
}
MK_QUANT_DOT_ACT_SPEC_HAND_AVX2(dot_act, dot_act_spec, dot_act_avx2_hand)
MK_QUANT_DOT_ACT4_K(dot_act4, KGemmKind::q3_K, dot_act)
MK_QUANT_GEMM_ACT_K(gemm_act, KGemmKind::q3_K, dot_act_generic, dot_act_avx2_hand)
}  // namespace

extern const QuantType kQ3_K = {DType::Q3_K, "q3_K", 11, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale,
                                &kQ8_KAct, dot_act, {dot_act_generic, dot_act_avx2, dot_act_avx512},
                                dot_act4, gemm_act, {gemm_act_generic, gemm_act_avx2, gemm_act_avxvnni, gemm_act_avx512vnni,
                                                     gemm_act_avx512vnni}};
}  // namespace mk::quant
