// Hand-written AVX2 pieces for the hottest dots (q4_0, q4_1, q8_0, q4_K, q6_K). They keep the
// contract of quant.h: 16 lanes held in two 8-float registers (lo = lanes 0..7, hi = 8..15), every
// weight computed with the scalar code's float operations in its order, products added with a
// separate multiply and add (no FMA), and the same final tree, so their bits equal the generic dot's
// (QuantDot.EveryVariantEqualsDequantizeThenDot).
#pragma once
// GCC 12 warns "'__Y' (may be) used uninitialized" inside its own AVX-512 intrinsic headers (the
// _mm512_undefined_* operand of masked builtins, GCC bug 105593); silenced for these headers only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#define MK_AVX2_FN __attribute__((target("avx2,fma,f16c,bmi2")))

namespace mk::quant::detail {

// Elements i .. i+31 of a row with 16 lanes: lanes get i..i+7, i+8..i+15, then i+16.., i+24.. in turn.
MK_AVX2_FN inline void acc32(__m256& lo, __m256& hi, const float* x, __m256 w0, __m256 w1, __m256 w2, __m256 w3) {
  lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(x), w0));
  hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(x + 8), w1));
  lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(x + 16), w2));
  hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(x + 24), w3));
}

// The tree (l, l + 8), (l, l + 4), (l, l + 2), (l, l + 1).
MK_AVX2_FN inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 s = _mm256_add_ps(lo, hi);
  const __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}

// Bytes 0..7 / 8..15 of a 128-bit register as 8 int32 (unsigned or signed bytes).
MK_AVX2_FN inline __m256i u8_lo(__m128i v) { return _mm256_cvtepu8_epi32(v); }
MK_AVX2_FN inline __m256i u8_hi(__m128i v) { return _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)); }
MK_AVX2_FN inline __m256i i8_lo(__m128i v) { return _mm256_cvtepi8_epi32(v); }
MK_AVX2_FN inline __m256i i8_hi(__m128i v) { return _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)); }
MK_AVX2_FN inline __m256 to_ps(__m256i v) { return _mm256_cvtepi32_ps(v); }

// 16 bytes of nibbles to 32 bytes: low nibbles first (elements 0..15), then the high ones.
MK_AVX2_FN inline __m256i bytes_from_nibbles_32(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i bytes = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
  return _mm256_and_si256(_mm256_set1_epi8(0x0f), bytes);
}
// An f16 field as float with F16C (exact, as ld_f16; one instruction).
MK_AVX2_FN inline float ld_f16c(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
// ggml's hsum_float_8 (detail::hsum8).
MK_AVX2_FN inline float hsum_float_8(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

}  // namespace mk::quant::detail
