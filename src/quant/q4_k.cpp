// q4_K (ggml id 12): 256 elements in 144 bytes, { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }
// (ggml-common.h block_q4_K). Eight sub-blocks of 32 with a 6-bit scale and a 6-bit min, packed as
// ggml's get_scale_min_k4. Element e (c = e / 64, h = e % 64 / 32, l = e % 32) is nibble h of
// qs[32 c + l], sub-block 2 c + h; value (d*sc) * q - (dmin*m).
#include <algorithm>

#include "quant/k_scales.h"
#include "quant/avx2.h"
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
}  // namespace

extern const QuantType kQ4_K = {DType::Q4_K, "q4_K", 12, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale};
}  // namespace mk::quant
