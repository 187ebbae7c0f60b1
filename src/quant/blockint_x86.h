// gemm_act tiles for q4_1 weights with block-integer numerics (quant.h dot_act of q4_1: per block the
// exact int32 dot of the 32 nibbles with the 32 activation bytes, then acc = fma(d_w * d_x,
// float(isum), acc) and summs = fma(m_w, s_x, summs) in block order, dot = acc + summs).
//
// The weight rows of a tile sit one per vector lane (8 rows per 256-bit register, 16 per 512-bit
// one), so the float work is done once per (row, activation row, block) for all lanes at once:
// per block, four gathers fetch dword k (k < 4) of each row's 16 nibble bytes, i.e. elements
// 4k..4k+3 (low nibbles) and 16+4k..16+4k+3 (high nibbles), one more the (d, m) pair; each of the 8
// dwords is then multiplied against the matching 4 activation bytes broadcast to every lane
// (vpdpbusd, or vpmaddubsw + vpmaddwd on AVX2: nibble times byte pairs stay within int16), and the
// lane sums are the block's exact integer dots. Per (8 or 16 rows, activation row, block): 8 integer
// dot steps, one multiply, one convert, two fmas for 256 or 512 multiply-adds, where the per-lane
// numerics of the other legacy types need four vector operations per 64 (gemm_x86.h). As llama.cpp's
// repacked x86 kernels do, without repacking: the gathers read the GGUF blocks where they lie.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/gemm_x86.h"

namespace mk::quant::detail {

constexpr int kQ41Bytes = 20, kQ81Bytes = 36;

// Per-call activation scales as f32: dx[b * na + a], sx[b * na + a] for a chunk of na rows.
inline void q41_act_scales(const uint8_t* const* y, int na, int64_t nb, float* dx, float* sx) {
  for (int64_t b = 0; b < nb; ++b)
    for (int a = 0; a < na; ++a) {
      dx[b * na + a] = ld_f16(y[a] + b * kQ81Bytes);
      sx[b * na + a] = ld_f16(y[a] + b * kQ81Bytes + 2);
    }
}

// One tile body, stamped under each instruction set's target attribute (a function's target cannot
// depend on a template argument). V: register type; LANES rows per register; GATHER(base, idx) the
// dwords at base + idx lanes; DP(acc, u, y32) acc + exact 4-byte dots of unsigned u with the
// activation dword y32 in every lane; SCALES(dm, &d, &m) the f32 d and m from the (d | m << 16)
// dwords; LDV / STV an unaligned vector load / store at a void pointer.
// MODE 0: the weights come from the gathers; 1: from the gathers, and are kept in buf ([b][5]
// vectors: dwords 0..3 of the nibble bytes, then d | m << 16) for the group's next activation chunks;
// 2: from buf (plain loads: the gathers are paid once per weight group, not once per chunk).
#define MK_Q41_TILE(FN, ATTR, V, VI, LANES, SETZ_PS, SETZ_SI, SET1_PS, SET1_EPI8, AND, SRLI16, CVT, MUL, FMA, ADD, \
                    STORE, GATHER, DP, SCALES, LDV, STV)                                                            \
  template <int NA, int MODE>                                                                                       \
  ATTR inline void FN(const uint8_t* g, VI idx, const uint8_t* const* y, const float* dx, const float* sx, int64_t nb, \
                      const uint8_t* pf, size_t ws, uint8_t* buf, float* out) {                                     \
    constexpr int kVB = LANES * 4; /* bytes per vector */                                                           \
    V acc[NA], summs[NA];                                                                                           \
    for (int a = 0; a < NA; ++a) acc[a] = summs[a] = SETZ_PS();                                                     \
    const VI m4 = SET1_EPI8(0x0f);                                                                                  \
    for (int64_t b = 0; b < nb; ++b) {                                                                              \
      const uint8_t* blk = g + b * kQ41Bytes;                                                                       \
      uint8_t* bb = buf + b * 5 * kVB;                                                                              \
      /* the rows of a later group, a line per row every 3 blocks (60 bytes: no line skipped) */                    \
      if (MODE != 2 && pf && b % 3 == 0)                                                                            \
        for (int r = 0; r < LANES; ++r) _mm_prefetch(reinterpret_cast<const char*>(pf + r * ws + b * kQ41Bytes), _MM_HINT_T0); \
      VI is[NA];                                                                                                    \
      for (int a = 0; a < NA; ++a) is[a] = SETZ_SI();                                                               \
      for (int k = 0; k < 4; ++k) {                                                                                 \
        VI c;                                                                                                       \
        if constexpr (MODE == 2) {                                                                                  \
          c = LDV(bb + k * kVB);                                                                                    \
        } else {                                                                                                    \
          c = GATHER(blk + 4 + 4 * k, idx);                                                                         \
          if constexpr (MODE == 1) STV(bb + k * kVB, c);                                                            \
        }                                                                                                           \
        const VI lo = AND(c, m4), hi = AND(SRLI16(c, 4), m4);                                                       \
        for (int a = 0; a < NA; ++a) {                                                                              \
          const uint8_t* q = y[a] + b * kQ81Bytes + 4;                                                              \
          int32_t y0, y1;                                                                                           \
          std::memcpy(&y0, q + 4 * k, 4);                                                                           \
          std::memcpy(&y1, q + 16 + 4 * k, 4);                                                                      \
          is[a] = DP(DP(is[a], lo, y0), hi, y1);                                                                    \
        }                                                                                                           \
      }                                                                                                             \
      VI dm;                                                                                                        \
      if constexpr (MODE == 2) {                                                                                    \
        dm = LDV(bb + 4 * kVB);                                                                                     \
      } else {                                                                                                      \
        dm = GATHER(blk, idx);                                                                                      \
        if constexpr (MODE == 1) STV(bb + 4 * kVB, dm);                                                             \
      }                                                                                                             \
      V dw, mw;                                                                                                     \
      SCALES(dm, dw, mw);                                                                                           \
      for (int a = 0; a < NA; ++a) {                                                                                \
        acc[a] = FMA(MUL(dw, SET1_PS(dx[b * NA + a])), CVT(is[a]), acc[a]);                                         \
        summs[a] = FMA(mw, SET1_PS(sx[b * NA + a]), summs[a]);                                                      \
      }                                                                                                             \
    }                                                                                                               \
    for (int a = 0; a < NA; ++a) STORE(out + a * LANES, ADD(acc[a], summs[a]));                                     \
  }                                                                                                                 \
  template <int MODE>                                                                                               \
  ATTR inline void FN##_na(int na, const uint8_t* g, VI idx, const uint8_t* const* y, const float* dx, const float* sx, \
                           int64_t nb, const uint8_t* pf, size_t ws, uint8_t* buf, float* t) {                      \
    switch (na) {                                                                                                   \
      case 1: return FN<1, MODE>(g, idx, y, dx, sx, nb, pf, ws, buf, t);                                            \
      case 2: return FN<2, MODE>(g, idx, y, dx, sx, nb, pf, ws, buf, t);                                            \
      case 3: return FN<3, MODE>(g, idx, y, dx, sx, nb, pf, ws, buf, t);                                            \
      case 4: return FN<4, MODE>(g, idx, y, dx, sx, nb, pf, ws, buf, t);                                            \
      case 5: return FN<5, MODE>(g, idx, y, dx, sx, nb, pf, ws, buf, t);                                            \
      case 6: return FN<6, MODE>(g, idx, y, dx, sx, nb, pf, ws, buf, t);                                            \
      case 7: return FN<7, MODE>(g, idx, y, dx, sx, nb, pf, ws, buf, t);                                            \
      default: return FN<8, MODE>(g, idx, y, dx, sx, nb, pf, ws, buf, t);                                           \
    }                                                                                                               \
  }                                                                                                                 \
  /* gemm_act: the activation rows' scales to f32 once per call ([chunk of 8][b][row]); then per group */          \
  /* of LANES weight rows (the last one repeats its last row in the spare lanes) each chunk of up to 8 */           \
  /* activation rows, the first chunk gathering the group's blocks (and keeping them when more follow) */          \
  ATTR void FN##_rows(const void* w, size_t ws, int64_t nw, const void* xq, size_t xs, int64_t na, int64_t n,      \
                      float* out, int64_t ldo) {                                                                    \
    const uint8_t* wb = static_cast<const uint8_t*>(w);                                                             \
    const uint8_t* xb = static_cast<const uint8_t*>(xq);                                                            \
    const int64_t nb = n / 32;                                                                                      \
    thread_local std::vector<float> scales;                                                                         \
    thread_local std::vector<uint8_t> buf;                                                                          \
    scales.resize(static_cast<size_t>(2 * na * nb));                                                                \
    if (na > 8) buf.resize(static_cast<size_t>(nb * 5 * LANES * 4));                                                \
    float* dx = scales.data();                                                                                      \
    float* sx = dx + na * nb;                                                                                       \
    for (int64_t a0 = 0; a0 < na; a0 += 8) {                                                                        \
      const int cols = static_cast<int>(std::min<int64_t>(8, na - a0));                                             \
      const uint8_t* y[8];                                                                                          \
      for (int a = 0; a < cols; ++a) y[a] = xb + static_cast<size_t>(a0 + a) * xs;                                  \
      q41_act_scales(y, cols, nb, dx + a0 * nb, sx + a0 * nb);                                                      \
    }                                                                                                               \
    for (int64_t i0 = 0; i0 < nw; i0 += LANES) {                                                                    \
      const int rows = static_cast<int>(std::min<int64_t>(LANES, nw - i0));                                         \
      alignas(64) int32_t off[LANES];                                                                               \
      for (int r = 0; r < LANES; ++r) off[r] = static_cast<int32_t>(std::min(r, rows - 1) * static_cast<int64_t>(ws)); \
      VI idx;                                                                                                       \
      std::memcpy(&idx, off, sizeof(idx));                                                                          \
      const uint8_t* g = wb + static_cast<size_t>(i0) * ws;                                                         \
      const uint8_t* pf = i0 + 2 * LANES < nw ? g + 2 * LANES * ws : nullptr; /* the group after next */           \
      for (int64_t a0 = 0; a0 < na; a0 += 8) {                                                                      \
        const int cols = static_cast<int>(std::min<int64_t>(8, na - a0));                                           \
        const uint8_t* y[8];                                                                                        \
        for (int a = 0; a < cols; ++a) y[a] = xb + static_cast<size_t>(a0 + a) * xs;                                \
        alignas(64) float t[8 * LANES];                                                                             \
        if (a0 > 0)                                                                                                 \
          FN##_na<2>(cols, g, idx, y, dx + a0 * nb, sx + a0 * nb, nb, pf, ws, buf.data(), t);                       \
        else if (na > 8)                                                                                            \
          FN##_na<1>(cols, g, idx, y, dx, sx, nb, pf, ws, buf.data(), t);                                           \
        else                                                                                                        \
          FN##_na<0>(cols, g, idx, y, dx, sx, nb, pf, ws, nullptr, t);                                              \
        for (int a = 0; a < cols; ++a)                                                                              \
          for (int r = 0; r < rows; ++r) out[(a0 + a) * ldo + i0 + r] = t[a * LANES + r];                           \
      }                                                                                                             \
    }                                                                                                               \
  }

// ---- 256 bits: 8 rows per register.
MK_AVX2_FN inline __m256i q41_gather256(const uint8_t* base, __m256i idx) {
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), idx, 1);
}
MK_AVX2_FN inline void q41_scales256(__m256i dm, __m256& d, __m256& m) {
  const __m256i lo = _mm256_and_si256(dm, _mm256_set1_epi32(0xffff)), hi = _mm256_srli_epi32(dm, 16);
  d = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)));
  m = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
}
MK_AVX2_FN inline __m256i q41_dp256_avx2(__m256i acc, __m256i u, int32_t y) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_set1_epi32(y)), _mm256_set1_epi16(1)));
}
MK_AVXVNNI_FN inline __m256i q41_dp256_avxvnni(__m256i acc, __m256i u, int32_t y) {
  return _mm256_dpbusd_avx_epi32(acc, u, _mm256_set1_epi32(y));
}
MK_AVX2_FN inline __m256i q41_ld256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
MK_AVX2_FN inline void q41_st256(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
#define MK_Q41_TILE256(FN, ATTR, DP)                                                                                  \
  MK_Q41_TILE(FN, ATTR, __m256, __m256i, 8, _mm256_setzero_ps, _mm256_setzero_si256, _mm256_set1_ps, _mm256_set1_epi8, \
              _mm256_and_si256, _mm256_srli_epi16, _mm256_cvtepi32_ps, _mm256_mul_ps, _mm256_fmadd_ps, _mm256_add_ps,  \
              _mm256_store_ps, q41_gather256, DP, q41_scales256, q41_ld256, q41_st256)
MK_Q41_TILE256(q41_tile256_avx2, MK_AVX2_FN, q41_dp256_avx2)
MK_Q41_TILE256(q41_tile256_avxvnni, MK_AVXVNNI_FN, q41_dp256_avxvnni)

// ---- 512 bits (AVX-512 VNNI): 16 rows per register.
MK_AVX512VNNI_FN inline __m512i q41_gather512(const uint8_t* base, __m512i idx) {
  return _mm512_i32gather_epi32(idx, base, 1);
}
MK_AVX512VNNI_FN inline void q41_scales512(__m512i dm, __m512& d, __m512& m) {
  d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
  m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
}
MK_AVX512VNNI_FN inline __m512i q41_dp512(__m512i acc, __m512i u, int32_t y) {
  return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(y));
}
MK_AVX512VNNI_FN inline __m512i q41_ld512(const void* p) { return _mm512_loadu_si512(p); }
MK_AVX512VNNI_FN inline void q41_st512(void* p, __m512i v) { _mm512_storeu_si512(p, v); }
MK_AVX512VNNI_FN inline __m512i q41_srli512(__m512i v, int s) { return _mm512_srli_epi16(v, static_cast<unsigned>(s)); }
MK_Q41_TILE(q41_tile512, MK_AVX512VNNI_FN, __m512, __m512i, 16, _mm512_setzero_ps, _mm512_setzero_si512, _mm512_set1_ps,
            _mm512_set1_epi8, _mm512_and_si512, q41_srli512, _mm512_cvtepi32_ps, _mm512_mul_ps, _mm512_fmadd_ps,
            _mm512_add_ps, _mm512_store_ps, q41_gather512, q41_dp512, q41_scales512, q41_ld512, q41_st512)

}  // namespace mk::quant::detail
