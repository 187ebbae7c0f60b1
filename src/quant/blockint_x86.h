// gemm_act tiles for q4_0, q4_1 and q8_0 weights with block-integer numerics (quant.h dot_act of
// these types: per block the exact int32 dot of the 32 weight integers with the 32 activation bytes,
// then acc = fma(d_w * d_x, float(isum), acc), for q4_1 also summs = fma(m_w, s_x, summs), in block
// order; dot = acc (+ summs)).
//
// The weight rows of a tile sit one per vector lane (8 rows per 256-bit register, 16 per 512-bit
// one), so the float work is done once per (row, activation row, block) for all lanes at once. Per
// block, gathers fetch dword k of each row's quants: for the nibble types k < 4, i.e. elements
// 4k..4k+3 (low nibbles) and 16+4k..16+4k+3 (high nibbles); for q8_0 k < 8, elements 4k..4k+3; one
// more gather the block's first dword (d, and m for q4_1). Each weight dword is multiplied against
// the matching 4 activation bytes broadcast to every lane (vpdpbusd, or vpmaddubsw + vpmaddwd on
// AVX2), and the lane sums are the block's exact integer dots. vpdpbusd takes unsigned weights, so
// q4_0's nibbles q (value q - 8) and q8_0's bytes x + 128 start from -8 * sum(y) and -128 * sum(y)
// (per activation block, from the call's table), as llama.cpp's VNNI paths do; AVX2 multiplies q8_0
// as |x| times y with x's sign (no int16 step can saturate). Per (8 or 16 rows, activation row,
// block): 8 integer dot steps, one multiply, one convert, one or two fmas for 256 or 512
// multiply-adds, where the per-lane numerics of q5_0 / q5_1 need four vector operations per 64
// (gemm_x86.h). As llama.cpp's repacked x86 kernels do, without repacking: the gathers read the GGUF
// blocks where they lie, once per weight group and call (kept in an L1 buffer for the next chunks of
// activation rows).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/gemm_x86.h"

namespace mk::quant::detail {

enum class BiKind { q4_0, q4_1, q8_0 };
template <BiKind K>
struct BiLayout {
  static constexpr int kBytes = K == BiKind::q4_0 ? 18 : K == BiKind::q4_1 ? 20 : 34;  // weight block
  static constexpr int kQs = K == BiKind::q4_1 ? 4 : 2;                                 // its quants
  static constexpr bool kMin = K == BiKind::q4_1;                                       // q8_1 activations
  static constexpr bool kNib = K != BiKind::q8_0;
  static constexpr int kXBytes = kMin ? 36 : 34, kXQs = kMin ? 4 : 2;  // activation block, its quants
  static constexpr int kWV = kNib ? 4 : 8;                              // weight dwords gathered per block
  static constexpr int kCorr = K == BiKind::q4_0 ? 8 : K == BiKind::q8_0 ? 128 : 0;
};

// Per-call activation tables for a chunk of na rows ([b][a]): d_x and s_x as f32, -kCorr * sum(y).
template <BiKind K>
MK_AVX2_FN inline void bi_act_tables(const uint8_t* const* y, int na, int64_t nb, float* dx, float* sx, int32_t* corr) {
  using L = BiLayout<K>;
  for (int64_t b = 0; b < nb; ++b)
    for (int a = 0; a < na; ++a) {
      const uint8_t* yb = y[a] + b * L::kXBytes;
      dx[b * na + a] = ld_f16c(yb);
      if constexpr (L::kMin) sx[b * na + a] = ld_f16c(yb + 2);
      if constexpr (L::kCorr != 0) {
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) sum += static_cast<int8_t>(yb[L::kXQs + j]);
        corr[b * na + a] = -L::kCorr * sum;
      }
    }
}

// The tables of all na activation rows, in chunks of 8 ([chunk][b][row]), in thread-local storage
// that the next call on this thread reuses (tiles do not nest).
struct BiActTables {
  float* dx;
  float* sx;
  int32_t* corr;
};
template <BiKind K>
MK_AVX2_FN inline BiActTables bi_act_tables_all(const uint8_t* xb, size_t xs, int64_t na, int64_t nb) {
  using L = BiLayout<K>;
  thread_local std::vector<float> scales;
  thread_local std::vector<int32_t> corrs;
  scales.resize(static_cast<size_t>(2 * na * nb));
  if (L::kCorr != 0) corrs.resize(static_cast<size_t>(na * nb));
  const BiActTables t{scales.data(), scales.data() + na * nb, corrs.data()};
  for (int64_t a0 = 0; a0 < na; a0 += 8) {
    const int cols = static_cast<int>(std::min<int64_t>(8, na - a0));
    const uint8_t* y[8];
    for (int a = 0; a < cols; ++a) y[a] = xb + static_cast<size_t>(a0 + a) * xs;
    bi_act_tables<K>(y, cols, nb, t.dx + a0 * nb, t.sx + a0 * nb, L::kCorr != 0 ? t.corr + a0 * nb : nullptr);
  }
  return t;
}

// One tile body, stamped under each instruction set's target attribute (a function's target cannot
// depend on a template argument). V: register type; LANES rows per register; GATHER(base, ix) the
// dwords at base + each row's offset (IDX(off) makes the index vectors), GATHER2 two of them; DP(acc, u, y) acc + the exact 4-byte dots of unsigned u with signed y
// per lane; DP16(acc, u, y) / WIDEN16(acc, s): acc + the int16 pair sums of u times y, acc + s's int16 pairs as
// int32 (AVX2's nibble types, SIGN_TRICK); SCALES(dm, &d, &m) the f32 d (low half) and m (high half) of the first dword of each
// block; LDV / STV an unaligned vector load / store at a void pointer; SIGN_TRICK: q8_0 as |x| times
// y with x's sign (AVX2, whose int16 steps would saturate on x + 128) instead of x + 128 with a
// correction.
// MODE 0: the weights come from the gathers; 1: from the gathers, and are kept in buf ([b][kWV + 1]
// vectors: the quant dwords, then the first dword) for the group's next activation chunks; 2: from
// buf (plain loads: the gathers are paid once per weight group, not once per chunk), prefetching
// the blocks of pf, a later group in buf's layout (packed weights), when pf is not 0; 3: as 2 from
// a packed group of 16 rows (QuantType::pack, 64-byte vectors) read by 8-lane tiles, buf the group's
// start plus 32 bytes for its rows 8..15, pf (all 16 rows) prefetched as in 2.
#define MK_BI_TILE(FN, ATTR, V, VI, LANES, SETZ_PS, SETZ_SI, SET1_PS, SET1_EPI8, SET1_EPI32, AND, XOR, SRLI16, ABS8, \
                   SIGN8, CVT, MUL, FMA, ADD, STORE, IDX, GATHER, GATHER2, DP, DP16, WIDEN16, SCALES, LDV, STV, SIGN_TRICK)                           \
  template <BiKind K, int NA, int MODE>                                                                              \
  ATTR inline void FN(const uint8_t* g, const int32_t* off, const uint8_t* const* y, const float* dx, const float* sx, \
                      const int32_t* corr, int64_t nb, uintptr_t pf, size_t ws, uint8_t* buf, float* out) {          \
    using L = BiLayout<K>;                                                                                           \
    constexpr int kVB = LANES * 4; /* bytes per vector */                                                            \
    constexpr int kPV = MODE == 3 ? 64 : kVB; /* bytes per vector in buf */                                          \
    constexpr bool kSign = K == BiKind::q8_0 && SIGN_TRICK; /* AVX2 q8_0: |x| times y with x's sign */               \
    constexpr bool kCorr = L::kCorr != 0 && !kSign;                                                                  \
    V acc[NA], summs[NA];                                                                                            \
    for (int a = 0; a < NA; ++a) acc[a] = summs[a] = SETZ_PS();                                                      \
    const VI m4 = SET1_EPI8(0x0f), x80 = SET1_EPI8(static_cast<char>(0x80));                                         \
    const auto ix = IDX(off);                                                                                        \
    for (int64_t b = 0; b < nb; ++b) {                                                                               \
      const uint8_t* blk = g + b * L::kBytes;                                                                        \
      uint8_t* bb = MODE != 0 ? buf + b * (L::kWV + 1) * kPV : nullptr; /* buf is null in MODE 0 */             \
      /* the rows of a later group: a line per row every 3 blocks or less (no line skipped); the addresses */         \
      /* are formed as integers (rows of that group past the matrix would be pointers past the array; a prefetch */  \
      /* never faults) */                                                                                            \
      if (MODE < 2 && pf != 0 && b % (64 / L::kBytes) == 0)                                                          \
        for (int r = 0; r < LANES; ++r)                                                                              \
          _mm_prefetch(reinterpret_cast<const char*>(pf + r * ws + static_cast<uintptr_t>(b * L::kBytes)),            \
                       NA >= 4 ? _MM_HINT_T1 : _MM_HINT_T0);                                                         \
      /* MODE 2 with pf: block b of a later group laid out as buf (packed weights, QuantType::pack); into L2 */     \
      /* when 4 or more activation rows share each weight vector (BM_QuantGemmPacked *_streamed, Zen 4: q8_0 at 16 */   \
      /* rows 107 -> 159 Gmacs/s, near its 171 from L2; into L1 the line fills queue up behind the misses), into */  \
      /* L1 for fewer (one row: q4_1 43 Gmacs/s, 34 with L2, at the memory's bandwidth) */                           \
      if (MODE >= 2 && pf != 0)                                                                                      \
        for (int q = 0; q < (L::kWV + 1) * kPV; q += 64)                                                             \
          _mm_prefetch(reinterpret_cast<const char*>(pf + static_cast<uintptr_t>(b * (L::kWV + 1) * kPV + q)),        \
                       NA >= 4 ? _MM_HINT_T1 : _MM_HINT_T0);                                                         \
      VI is[NA], c_next;                                                                                             \
      /* AVX2 nibbles: the block's 8 vpmaddubsw pair sums added as int16 (each at most 2 x 15 x 128 = 3840 */         \
      /* in magnitude, 8 of them 30720 < 32768: exact), then one vpmaddwd: 9 multiplies per block instead of 16 */    \
      constexpr bool kI16 = SIGN_TRICK && L::kNib;                                                                   \
      VI s16[NA];                                                                                                    \
      if constexpr (kI16)                                                                                            \
        for (int a = 0; a < NA; ++a) s16[a] = SETZ_SI();                                                             \
      for (int a = 0; a < NA; ++a) is[a] = kCorr ? SET1_EPI32(corr[b * NA + a]) : SETZ_SI();                         \
      for (int k = 0; k < L::kWV; ++k) {                                                                             \
        VI c;                                                                                                        \
        if constexpr (MODE >= 2) {                                                                                   \
          c = LDV(bb + k * kPV);                                                                                     \
        } else if (k % 2 == 0) { /* quant dwords k and k + 1 of every row: two qword gathers */                      \
          GATHER2(blk + L::kQs + 4 * k, ix, c, c_next);                                                              \
          if constexpr (MODE == 1) {                                                                                 \
            STV(bb + k * kVB, c);                                                                                    \
            STV(bb + (k + 1) * kVB, c_next);                                                                         \
          }                                                                                                          \
        } else {                                                                                                     \
          c = c_next;                                                                                                \
        }                                                                                                            \
        if constexpr (L::kNib) {                                                                                     \
          const VI lo = AND(c, m4), hi = AND(SRLI16(c, 4), m4);                                                      \
          for (int a = 0; a < NA; ++a) {                                                                             \
            const uint8_t* q = y[a] + b * L::kXBytes + L::kXQs;                                                      \
            int32_t y0, y1;                                                                                          \
            std::memcpy(&y0, q + 4 * k, 4);                                                                          \
            std::memcpy(&y1, q + 16 + 4 * k, 4);                                                                     \
            if constexpr (kI16)                                                                                      \
              s16[a] = DP16(DP16(s16[a], lo, SET1_EPI32(y0)), hi, SET1_EPI32(y1));                                   \
            else                                                                                                     \
              is[a] = DP(DP(is[a], lo, SET1_EPI32(y0)), hi, SET1_EPI32(y1));                                         \
          }                                                                                                          \
        } else {                                                                                                     \
          const VI u = kSign ? ABS8(c) : XOR(c, x80);                                                                \
          for (int a = 0; a < NA; ++a) {                                                                             \
            int32_t y0;                                                                                              \
            std::memcpy(&y0, y[a] + b * L::kXBytes + L::kXQs + 4 * k, 4);                                            \
            is[a] = DP(is[a], u, kSign ? SIGN8(SET1_EPI32(y0), c) : SET1_EPI32(y0));                                 \
          }                                                                                                          \
        }                                                                                                            \
      }                                                                                                              \
      if constexpr (kI16)                                                                                            \
        for (int a = 0; a < NA; ++a) is[a] = WIDEN16(is[a], s16[a]);                                                 \
      VI dm;                                                                                                         \
      if constexpr (MODE >= 2) {                                                                                     \
        dm = LDV(bb + L::kWV * kPV);                                                                                 \
      } else {                                                                                                       \
        dm = GATHER(blk, ix);                                                                                        \
        if constexpr (MODE == 1) STV(bb + L::kWV * kVB, dm);                                                         \
      }                                                                                                              \
      V dw, mw;                                                                                                      \
      SCALES(dm, dw, mw);                                                                                            \
      for (int a = 0; a < NA; ++a) {                                                                                 \
        acc[a] = FMA(MUL(dw, SET1_PS(dx[b * NA + a])), CVT(is[a]), acc[a]);                                          \
        if constexpr (L::kMin) summs[a] = FMA(mw, SET1_PS(sx[b * NA + a]), summs[a]);                                \
      }                                                                                                              \
    }                                                                                                                \
    for (int a = 0; a < NA; ++a) STORE(out + a * LANES, L::kMin ? ADD(acc[a], summs[a]) : acc[a]);                   \
  }                                                                                                                  \
  template <BiKind K, int MODE>                                                                                      \
  ATTR inline void FN##_na(int na, const uint8_t* g, const int32_t* off, const uint8_t* const* y, const float* dx,    \
                           const float* sx,                                                                         \
                           const int32_t* corr, int64_t nb, uintptr_t pf, size_t ws, uint8_t* buf, float* t) {       \
    switch (na) {                                                                                                    \
      case 1: return FN<K, 1, MODE>(g, off, y, dx, sx, corr, nb, pf, ws, buf, t);                                    \
      case 2: return FN<K, 2, MODE>(g, off, y, dx, sx, corr, nb, pf, ws, buf, t);                                    \
      case 3: return FN<K, 3, MODE>(g, off, y, dx, sx, corr, nb, pf, ws, buf, t);                                    \
      case 4: return FN<K, 4, MODE>(g, off, y, dx, sx, corr, nb, pf, ws, buf, t);                                    \
      case 5: return FN<K, 5, MODE>(g, off, y, dx, sx, corr, nb, pf, ws, buf, t);                                    \
      case 6: return FN<K, 6, MODE>(g, off, y, dx, sx, corr, nb, pf, ws, buf, t);                                    \
      case 7: return FN<K, 7, MODE>(g, off, y, dx, sx, corr, nb, pf, ws, buf, t);                                    \
      default: return FN<K, 8, MODE>(g, off, y, dx, sx, corr, nb, pf, ws, buf, t);                                   \
    }                                                                                                                \
  }                                                                                                                  \
  /* gemm_act: the activation tables once per call ([chunk of 8][b][row]); then per group of LANES */                \
  /* weight rows (the last one repeats its last row in the spare lanes) each chunk of up to 8 */                     \
  /* activation rows, the first chunk gathering the group's blocks (and keeping them when more follow) */            \
  template <BiKind K>                                                                                                \
  ATTR void FN##_rows(const void* w, size_t ws, int64_t nw, const void* xq, size_t xs, int64_t na, int64_t n,       \
                      float* out, int64_t ldo) {                                                                     \
    using L = BiLayout<K>;                                                                                           \
    const uint8_t* wb = static_cast<const uint8_t*>(w);                                                              \
    const uint8_t* xb = static_cast<const uint8_t*>(xq);                                                             \
    const int64_t nb = n / 32;                                                                                       \
    thread_local std::vector<uint8_t> buf;                                                                           \
    if (na > 8) buf.resize(static_cast<size_t>(nb * (L::kWV + 1) * LANES * 4));                                      \
    const BiActTables tab = bi_act_tables_all<K>(xb, xs, na, nb);                                                    \
    float* dx = tab.dx;                                                                                              \
    float* sx = tab.sx;                                                                                              \
    int32_t* corr = tab.corr;                                                                                        \
    for (int64_t i0 = 0; i0 < nw; i0 += LANES) {                                                                     \
      const int rows = static_cast<int>(std::min<int64_t>(LANES, nw - i0));                                          \
      alignas(64) int32_t off[LANES];                                                                                \
      for (int r = 0; r < LANES; ++r) off[r] = static_cast<int32_t>(std::min(r, rows - 1) * static_cast<int64_t>(ws)); \
      const uint8_t* g = wb + static_cast<size_t>(i0) * ws;                                                          \
      const uintptr_t pf = i0 + 2 * LANES < nw ? reinterpret_cast<uintptr_t>(g) + 2 * LANES * ws : 0; /* 2 groups on */ \
      for (int64_t a0 = 0; a0 < na; a0 += 8) {                                                                       \
        const int cols = static_cast<int>(std::min<int64_t>(8, na - a0));                                            \
        const uint8_t* y[8];                                                                                         \
        for (int a = 0; a < cols; ++a) y[a] = xb + static_cast<size_t>(a0 + a) * xs;                                 \
        const int32_t* cr = L::kCorr != 0 ? corr + a0 * nb : nullptr;                                               \
        alignas(64) float t[8 * LANES];                                                                              \
        if (a0 > 0)                                                                                                  \
          FN##_na<K, 2>(cols, g, off, y, dx + a0 * nb, sx + a0 * nb, cr, nb, 0, ws, buf.data(), t);                  \
        else if (na > 8)                                                                                             \
          FN##_na<K, 1>(cols, g, off, y, dx, sx, cr, nb, pf, ws, buf.data(), t);                                     \
        else                                                                                                         \
          FN##_na<K, 0>(cols, g, off, y, dx, sx, cr, nb, pf, ws, nullptr, t);                                        \
        for (int a = 0; a < cols; ++a) /* a whole group as one vector copy (a variable-length copy of 16 */          \
          if (rows == LANES) /* floats became rep movs, ~5% of the tile) */                                           \
            std::memcpy(out + (a0 + a) * ldo + i0, t + a * LANES, LANES * sizeof(float));                            \
          else                                                                                                       \
            for (int r = 0; r < rows; ++r) out[(a0 + a) * ldo + i0 + r] = t[a * LANES + r];                          \
      }                                                                                                              \
    }                                                                                                                \
  }

// ---- 256 bits: 8 rows per register.
// Row offsets as gather indices: d for dword gathers (lane r = row r), a / b for the two qword gathers
// whose even / odd dwords bi_gather2_* interleave back into row order (rows 0 1 4 5 and 2 3 6 7 per
// 8: _mm256_shuffle_ps picks dwords 0 and 2 of each source's 128-bit lane, a's then b's).
struct BiIdx256 {
  __m256i d;
  __m128i a, b;
};
MK_AVX2_FN inline BiIdx256 bi_idx256(const int32_t* o) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(o)), _mm_setr_epi32(o[0], o[1], o[4], o[5]),
          _mm_setr_epi32(o[2], o[3], o[6], o[7])};
}
MK_AVX2_FN inline __m256i bi_gather256(const uint8_t* base, const BiIdx256& ix) {
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(base), ix.d, 1);
}
// dwords 0 and 1 at base + each row's offset, as two row-ordered vectors (half the loads of two
// dword gathers).
MK_AVX2_FN inline void bi_gather2_256(const uint8_t* base, const BiIdx256& ix, __m256i& d0, __m256i& d1) {
  const __m256 qa = _mm256_castsi256_ps(_mm256_i32gather_epi64(reinterpret_cast<const long long*>(base), ix.a, 1));
  const __m256 qb = _mm256_castsi256_ps(_mm256_i32gather_epi64(reinterpret_cast<const long long*>(base), ix.b, 1));
  d0 = _mm256_castps_si256(_mm256_shuffle_ps(qa, qb, 0x88));
  d1 = _mm256_castps_si256(_mm256_shuffle_ps(qa, qb, 0xdd));
}
MK_AVX2_FN inline void bi_scales256(__m256i dm, __m256& d, __m256& m) {
  const __m256i lo = _mm256_and_si256(dm, _mm256_set1_epi32(0xffff)), hi = _mm256_srli_epi32(dm, 16);
  d = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)));
  m = _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
}
MK_AVX2_FN inline __m256i bi_dp256_avx2(__m256i acc, __m256i u, __m256i y) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), _mm256_set1_epi16(1)));
}
// acc + the int16 pair sums of unsigned u times signed y (vpmaddubsw), and acc + s's int16 pairs as int32.
MK_AVX2_FN inline __m256i bi_dp16_256(__m256i acc, __m256i u, __m256i y) {
  return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, y));
}
MK_AVX2_FN inline __m256i bi_widen16_256(__m256i acc, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(s, _mm256_set1_epi16(1)));
}
MK_AVXVNNI_FN inline __m256i bi_dp256_avxvnni(__m256i acc, __m256i u, __m256i y) {
  return _mm256_dpbusd_avx_epi32(acc, u, y);
}
MK_AVX2_FN inline __m256i bi_ld256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
MK_AVX2_FN inline void bi_st256(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
#define MK_BI_TILE256(FN, ATTR, DP, SIGN_TRICK)                                                                        \
  MK_BI_TILE(FN, ATTR, __m256, __m256i, 8, _mm256_setzero_ps, _mm256_setzero_si256, _mm256_set1_ps, _mm256_set1_epi8,   \
             _mm256_set1_epi32, _mm256_and_si256, _mm256_xor_si256, _mm256_srli_epi16, _mm256_abs_epi8,                 \
             _mm256_sign_epi8, _mm256_cvtepi32_ps, _mm256_mul_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_store_ps,      \
             bi_idx256, bi_gather256, bi_gather2_256, DP, bi_dp16_256, bi_widen16_256, bi_scales256, bi_ld256, bi_st256, \
             SIGN_TRICK)
// gemm_act on packed weights (QuantType::pack: groups of 16 rows, 64-byte vectors) with a 256-bit
// tile: each group as two 8-lane halves (MODE 3: rows 0..7 from the vectors' first 32 bytes, then
// rows 8..15 from their last 32, which the first half brought into cache), plain loads instead of
// the gathers, which AMD's cores before Zen 4 run as microcode (~9-20 cycles each: half the q4_1
// tile's time on a Zen 1). The same bits as FN##_rows. wp: the group of the tile's first row.
#define MK_BI_PACKED256(FN, ATTR)                                                                                    \
  template <BiKind K>                                                                                                \
  ATTR void FN##_packed_rows(const void* wp, int64_t nw, const void* xq, size_t xs, int64_t na, int64_t n,           \
                             float* out, int64_t ldo) {                                                              \
    using L = BiLayout<K>;                                                                                           \
    const uint8_t* xb = static_cast<const uint8_t*>(xq);                                                             \
    const int64_t nb = n / 32;                                                                                       \
    const size_t gb = static_cast<size_t>(nb) * (L::kWV + 1) * 64; /* a packed group's bytes */                     \
    const BiActTables tab = bi_act_tables_all<K>(xb, xs, na, nb);                                                    \
    float* dx = tab.dx;                                                                                              \
    float* sx = tab.sx;                                                                                              \
    int32_t* corr = tab.corr;                                                                                        \
    alignas(32) static const int32_t off[8] = {};                                                                    \
    for (int64_t i0 = 0; i0 < nw; i0 += 16) {                                                                        \
      uint8_t* g = const_cast<uint8_t*>(static_cast<const uint8_t*>(wp)) + static_cast<size_t>(i0 / 16) * gb; /* read only */ \
      for (int64_t a0 = 0; a0 < na; a0 += 8) {                                                                       \
        const int cols = static_cast<int>(std::min<int64_t>(8, na - a0));                                            \
        const uint8_t* y[8];                                                                                         \
        for (int a = 0; a < cols; ++a) y[a] = xb + static_cast<size_t>(a0 + a) * xs;                                 \
        for (int h = 0; h < 2; ++h) {                                                                                \
          const int rows = static_cast<int>(std::min<int64_t>(8, nw - i0 - 8 * h));                                  \
          if (rows <= 0) break;                                                                                      \
          alignas(32) float t[8 * 8];                                                                                \
          /* the group after next, prefetched block by block by the first half of the first chunk */                \
          const uintptr_t pf = a0 == 0 && h == 0 && i0 + 32 < nw ? reinterpret_cast<uintptr_t>(g + 2 * gb) : 0;      \
          FN##_na<K, 3>(cols, g, off, y, dx + a0 * nb, sx + a0 * nb, L::kCorr != 0 ? corr + a0 * nb : nullptr, nb,   \
                        pf, 0, g + 32 * h, t);                                                                       \
          for (int a = 0; a < cols; ++a) {                                                                           \
            float* o = out + (a0 + a) * ldo + i0 + 8 * h;                                                            \
            if (rows == 8)                                                                                           \
              _mm256_storeu_ps(o, _mm256_load_ps(t + a * 8));                                                        \
            else                                                                                                     \
              for (int r = 0; r < rows; ++r) o[r] = t[a * 8 + r];                                                    \
          }                                                                                                          \
        }                                                                                                            \
      }                                                                                                              \
    }                                                                                                                \
  }
MK_BI_TILE256(bi_tile256_avx2, MK_AVX2_FN, bi_dp256_avx2, true)
MK_BI_TILE256(bi_tile256_avxvnni, MK_AVXVNNI_FN, bi_dp256_avxvnni, false)
MK_BI_PACKED256(bi_tile256_avx2, MK_AVX2_FN)
MK_BI_PACKED256(bi_tile256_avxvnni, MK_AVXVNNI_FN)

// ---- 512 bits (AVX-512 VNNI): 16 rows per register.
struct BiIdx512 {
  __m512i d;
  __m256i a, b;
};
MK_AVX512VNNI_FN inline BiIdx512 bi_idx512(const int32_t* o) {
  return {_mm512_loadu_si512(o), _mm256_setr_epi32(o[0], o[1], o[4], o[5], o[8], o[9], o[12], o[13]),
          _mm256_setr_epi32(o[2], o[3], o[6], o[7], o[10], o[11], o[14], o[15])};
}
MK_AVX512VNNI_FN inline __m512i bi_gather512(const uint8_t* base, const BiIdx512& ix) {
  return _mm512_i32gather_epi32(ix.d, base, 1);
}
MK_AVX512VNNI_FN inline void bi_gather2_512(const uint8_t* base, const BiIdx512& ix, __m512i& d0, __m512i& d1) {
  const __m512 qa = _mm512_castsi512_ps(_mm512_i32gather_epi64(ix.a, base, 1));
  const __m512 qb = _mm512_castsi512_ps(_mm512_i32gather_epi64(ix.b, base, 1));
  d0 = _mm512_castps_si512(_mm512_shuffle_ps(qa, qb, 0x88));
  d1 = _mm512_castps_si512(_mm512_shuffle_ps(qa, qb, 0xdd));
}
MK_AVX512VNNI_FN inline void bi_scales512(__m512i dm, __m512& d, __m512& m) {
  d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
  m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
}
MK_AVX512VNNI_FN inline __m512i bi_dp512(__m512i acc, __m512i u, __m512i y) { return _mm512_dpbusd_epi32(acc, u, y); }
MK_AVX512VNNI_FN inline __m512i bi_abs512(__m512i v) { return _mm512_abs_epi8(v); }
MK_AVX512VNNI_FN inline __m512i bi_sign512(__m512i y, __m512i) { return y; }  // unused: no sign trick with VNNI
MK_AVX512VNNI_FN inline __m512i bi_ld512(const void* p) { return _mm512_loadu_si512(p); }
MK_AVX512VNNI_FN inline void bi_st512(void* p, __m512i v) { _mm512_storeu_si512(p, v); }
MK_AVX512VNNI_FN inline __m512i bi_srli512(__m512i v, int s) { return _mm512_srli_epi16(v, static_cast<unsigned>(s)); }
// unused (no int16 step with VNNI), for the macro's discarded branches
MK_AVX512VNNI_FN inline __m512i bi_dp16_512(__m512i acc, __m512i, __m512i) { return acc; }
MK_AVX512VNNI_FN inline __m512i bi_widen16_512(__m512i acc, __m512i) { return acc; }
MK_BI_TILE(bi_tile512, MK_AVX512VNNI_FN, __m512, __m512i, 16, _mm512_setzero_ps, _mm512_setzero_si512, _mm512_set1_ps,
           _mm512_set1_epi8, _mm512_set1_epi32, _mm512_and_si512, _mm512_xor_si512, bi_srli512, bi_abs512, bi_sign512,
           _mm512_cvtepi32_ps, _mm512_mul_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_store_ps, bi_idx512, bi_gather512,
           bi_gather2_512, bi_dp512, bi_dp16_512, bi_widen16_512,
           bi_scales512, bi_ld512, bi_st512, false)

}  // namespace mk::quant::detail
