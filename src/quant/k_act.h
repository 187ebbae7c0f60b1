// The K-quants' dot against q8_K activation blocks (quant.h QuantType::dot_act for q2_K .. q6_K):
// llama.cpp's arithmetic, the bits of ggml's AVX2 ggml_vec_dot_qN_K_q8_K (ggml-cpu arch/x86/quants.c).
//
// q8_K (ggml-common.h block_q8_K, QK_K = 256): 292 bytes, d:f32@0 qs:i8[256]@4 bsums:i16[16]@260,
// bsums[j] = sum of qs[16 j .. 16 j + 15]; value of element e: d * qs[e] (act.cpp act_q8_K()).
//
// Per 256-element super-block every K type computes, exactly in int32, 8 lanes
//   sumi[l] = sum over the elements e with e % 32 in [4 l, 4 l + 4) of sc(e / 16) * q(e) * qs[e]
// (q(e) the weight's integer, sc its 16-element group's integer scale; ggml's maddubs/madd lanes),
// then acc[l] = fma(d_x * d_w, float(sumi[l]), acc[l]) and at the end ggml's hsum_float_8 over acc.
// The types with a minimum add -dmin * m * sum(qs) through bsums, each as ggml does it (see the
// per-type files): q2_K into the same 8 lanes before sumi, q4_K in 4 lanes of their own, q5_K as
// one scalar. The integer parts never overflow int16 in the AVX2 kernels' maddubs steps, so the
// plain integer spec below and the hand-written kernels agree exactly.
#pragma once
#include <cstdint>
#include <cstring>

#include "quant/avx2.h"
#include "quant/k_scales.h"
#include "quant/quant_impl.h"

namespace mk::quant::detail {

constexpr int kQ8KBytes = 292, kQ8KQs = 4, kQ8KBsums = 260;
inline float q8k_d(const uint8_t* y) {
  float d;
  std::memcpy(&d, y, 4);
  return d;
}
inline int32_t q8k_bsum(const uint8_t* y, int j) {
  int16_t v;
  std::memcpy(&v, y + kQ8KBsums + 2 * j, 2);
  return v;
}

// The 8 integer lanes of one super-block: q[256] the weight integers, sc16[16] the scale of each
// group of 16, y the q8_K block.
// Written chunk by chunk (32 elements: two groups of 16, lanes 0..3 and 4..7) so that the compiler
// vectorises it; integer sums are exact, so any grouping gives the same lanes.
[[gnu::always_inline]] inline void k_lanes(const int8_t* q, const int32_t* sc16, const uint8_t* y, int32_t* sumi) {
  const int8_t* qy = reinterpret_cast<const int8_t*>(y + kQ8KQs);
  for (int l = 0; l < 8; ++l) sumi[l] = 0;
  for (int c = 0; c < 8; ++c) {
    int32_t prod[32];
    for (int j = 0; j < 32; ++j) prod[j] = static_cast<int32_t>(q[32 * c + j]) * static_cast<int32_t>(qy[32 * c + j]);
    for (int l = 0; l < 8; ++l)
      sumi[l] += sc16[2 * c + l / 4] * (prod[4 * l] + prod[4 * l + 1] + prod[4 * l + 2] + prod[4 * l + 3]);
  }
}

// AVX2 pieces shared by q4_K and q5_K (same 12-byte scale/min packing, 8 sub-blocks of 32): one
// super-block's weight integers (32 unsigned bytes per sub-block), scales (16 x i16 per sub-block,
// all equal) and mins (8 x i16).
struct K4Block {
  __m256i q[8], sc[8];
  __m128i mins;
};
MK_AVX2_FN inline void k4_scales(const uint8_t* s, K4Block& k) {
  uint32_t u[4];
  scales_mins_k4(s, u);
  __m128i v;
  std::memcpy(&v, u, 16);
  const __m256i sm = _mm256_cvtepu8_epi16(v);
  k.mins = _mm256_extracti128_si256(sm, 1);
  for (int j = 0; j < 8; ++j) k.sc[j] = _mm256_set1_epi16(static_cast<int16_t>((u[j / 4] >> (8 * (j % 4))) & 0xff));
}
// The mins part's 4 int32 lanes: lane l = m[2l] * (bsums[4l] + bsums[4l+1]) + m[2l+1] * (..).
MK_AVX2_FN inline __m128i k4_mins_lanes(__m128i mins, const uint8_t* y) {
  const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + kQ8KBsums));
  return _mm_madd_epi16(mins, _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
}
// sumi of k_lanes for one q8_K block: maddubs (unsigned weight bytes x signed activations), madd
// with the sub-block's scale, added.
MK_AVX2_FN inline __m256i k4_sumi(const K4Block& k, const uint8_t* y) {
  __m256i sumi = _mm256_setzero_si256();
  for (int s = 0; s < 8; ++s) {
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + kQ8KQs + 32 * s));
    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(k.sc[s], _mm256_maddubs_epi16(k.q[s], qy)));
  }
  return sumi;
}

// The variant/dispatch glue (NAME_generic, NAME_avx2, NAME_avx512, NAME) is quant_impl.h's
// MK_QUANT_DOT_ACT_SPEC_HAND_AVX2 over the per-type spec and hand-written AVX2 kernel.

}  // namespace mk::quant::detail
