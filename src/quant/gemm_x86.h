// Register-blocked tiles of dot_act (quant.h QuantType::gemm_act) for q5_0 and q5_1 weights (q4_0,
// q4_1 and q8_0 have block-integer numerics: blockint_x86.h): several weight rows x several
// activation rows per pass over the blocks, each weight block unpacked
// once for all activation rows and each activation block loaded once for all weight rows.
//
// Same bits as dot_act (quant.h): per 32-element block the exact int32 sums of 8 lanes of 4 products
// (integer sums are exact, so how they are formed does not matter), then per lane
// acc = fma(d_w * d_x, float(sum), acc), hsum_float_8 at the end, plus the scalar chain
// summs = fma(m_w, s_x, summs) for q5_1. What differs between the variants is only how the integer
// sums are formed:
//   avx2        vpmaddubsw + vpmaddwd (unsigned x signed bytes; no pair exceeds int16 here)
//   avxvnni     vpdpbusd on 256 bits (AVX-VNNI, Alder Lake and later)
//   avx512vnni  vpdpbusd on 512 bits: two weight rows per register (low half row i, high half row
//               i + 1) against the activation block broadcast to both halves.
// vpdpbusd multiplies unsigned by signed bytes, so weights go in unsigned with a correction folded
// into the accumulator's start value (as llama.cpp's VNNI paths do): q5_0's 5-bit q with
// -16 * sum4(y) (q - 16 = value); q5_1 needs none.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/avx2.h"
#include "quant/quant_impl.h"

#define MK_AVXVNNI_FN __attribute__((target("avxvnni,avx2,fma,f16c,bmi2")))
#define MK_AVX512VNNI_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")))

namespace mk::quant::detail {

// Asks for [p, p + bytes) in L1 ahead of its use (prefetcht0, one per 64-byte line; a prefetch never
// faults, so addresses past the matrix are harmless). A one-row decode streams every weight once from
// memory, and the hardware prefetcher alone left it latency-bound at ~1/3 of the read bandwidth
// (docs/PERFORMANCE.md, 2026-12-02).
inline void prefetch_bytes(const uint8_t* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
}

enum class GemmKind { q5_0, q5_1 };

template <GemmKind K>
struct GemmLayout {
  static constexpr int kBytes = K == GemmKind::q5_0 ? 22 : 24;  // weight block
  static constexpr int kQs = K == GemmKind::q5_0 ? 6 : K == GemmKind::q5_1 ? 8 : 2;  // quants
  static constexpr bool kFive = K == GemmKind::q5_0 || K == GemmKind::q5_1;  // 5th bits in a u32 qh
  static constexpr int kQh = K == GemmKind::q5_0 ? 2 : 4;                    // its offset
  static constexpr bool kMin = K == GemmKind::q5_1;   // q8_1 activations
  static constexpr int kXBytes = kMin ? 36 : 34, kXQs = kMin ? 4 : 2;
  static constexpr int kCorr = K == GemmKind::q5_0 ? 16 : 0;  // weight offset
};

// ggml's bytes_from_bits_32: byte j = 0xff where bit j of the little-endian u32 at p is set, else 0.
MK_AVX2_FN inline __m256i bytes_from_bits_32(const uint8_t* p) {
  uint32_t x32;
  __builtin_memcpy(&x32, p, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x32)), shuf);
  const __m256i bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  return _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1));
}
// The 32 unsigned weight integers of a q5_0 / q5_1 block at p: nibbles (elements 0..15
// low, 16..31 high), plus 16 where the 5th bit is set.
template <GemmKind K>
MK_AVX2_FN inline __m256i nibble_block_u8(const uint8_t* p) {
  using L = GemmLayout<K>;
  __m256i u = bytes_from_nibbles_32(p + L::kQs);
  if constexpr (L::kFive) u = _mm256_or_si256(u, _mm256_and_si256(bytes_from_bits_32(p + L::kQh), _mm256_set1_epi8(0x10)));
  return u;
}

// ---- 256-bit tiles (AVX2 or AVX-VNNI): NW weight rows x NA activation rows. One body, built under
// two target attributes (a function's target cannot depend on a template argument, and the AVX2
// build must not be allowed VNNI instructions: GCC fuses vpmaddwd + vpaddd into vpdpwssd where it may).
// gemm_act uses it for one activation row (decode, NA = 1); two or more go to MK_GEMM_TILE256T below.
#define MK_GEMM_TILE256(FN, ATTR, IS_VNNI, dpbusd)                                                                     \
  template <GemmKind K, int NW, int NA>                                                                       \
  ATTR inline void FN(const uint8_t* const* w, const uint8_t* const* y, int64_t nb, float* out) {             \
    using L = GemmLayout<K>;                                                                                  \
    __m256 acc[NW][NA];                                                                                       \
    float summs[NW][NA];                                                                                      \
    for (int i = 0; i < NW; ++i)                                                                              \
      for (int a = 0; a < NA; ++a) {                                                                          \
        acc[i][a] = _mm256_setzero_ps();                                                                      \
        summs[i][a] = 0;                                                                                      \
      }                                                                                                       \
    for (int64_t b = 0; b < nb; ++b) {                                                                        \
      __m256i u[NW];                                                                                          \
      float dw[NW], mw[NW];                                                                                   \
      for (int i = 0; i < NW; ++i) {                                                                          \
        const uint8_t* p = w[i] + b * L::kBytes;                                                              \
        dw[i] = ld_f16c(p);                                                                                   \
        if constexpr (L::kMin) mw[i] = ld_f16c(p + 2);                                                        \
        u[i] = nibble_block_u8<K>(p);                                                                         \
      }                                                                                                       \
      for (int a = 0; a < NA; ++a) {                                                                          \
        const uint8_t* yb = y[a] + b * L::kXBytes;                                                            \
        const float dx = ld_f16c(yb);                                                                         \
        float sx = 0;                                                                                         \
        if constexpr (L::kMin) sx = ld_f16c(yb + 2);                                                          \
        const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb + L::kXQs));                \
        __m256i base = _mm256_setzero_si256();                                                                \
        if constexpr (L::kCorr != 0)                                                                          \
          base = _mm256_sub_epi32(                                                                            \
              base, dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(L::kCorr)), qy));       \
        for (int i = 0; i < NW; ++i) {                                                                        \
          const __m256i isum = dpbusd(base, u[i], qy);                                                        \
          acc[i][a] = _mm256_fmadd_ps(_mm256_set1_ps(dw[i] * dx), _mm256_cvtepi32_ps(isum), acc[i][a]);       \
          if constexpr (L::kMin) summs[i][a] = std::fma(mw[i], sx, summs[i][a]);                              \
        }                                                                                                     \
      }                                                                                                       \
    }                                                                                                         \
    for (int i = 0; i < NW; ++i)                                                                              \
      for (int a = 0; a < NA; ++a)                                                                            \
        out[i * NA + a] = L::kMin ? hsum_float_8(acc[i][a]) + summs[i][a] : hsum_float_8(acc[i][a]);          \
  }

// acc + the exact int32 sums of 4 unsigned x signed byte products per lane.
MK_AVX2_FN inline __m256i dpbusd256_avx2(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
MK_AVXVNNI_FN inline __m256i dpbusd256_avxvnni(__m256i acc, __m256i u, __m256i s) {
  return _mm256_dpbusd_avx_epi32(acc, u, s);
}
MK_GEMM_TILE256(gemm_tile256_avx2, MK_AVX2_FN, false, dpbusd256_avx2)
MK_GEMM_TILE256(gemm_tile256_avxvnni, MK_AVXVNNI_FN, true, dpbusd256_avxvnni)

// ---- 256-bit tiles over per-call activation tables (two or more activation rows: prefill and
// batched decode). gemm_tile256 above re-reads each activation row's f16 scales (and, for q4_0 /
// q5_0, recomputes its correction) for every weight pair, and forms every scale product as a scalar
// multiply plus a broadcast: ~10 instructions per (weight row, activation row, block) where the dot
// itself needs 6. Here the activation rows are packed once per gemm_act call, block by block in
// chunks of up to 4 rows ([chunk][b][row]: 32 quant bytes, d_x and s_x as f32, the correction as 8
// int32), and the tile reads them with plain and broadcast loads: per (weight row, activation row,
// block) the integer dot, one convert, one multiply d_w * d_x (lane-wise, the same product as the
// scalar one), one fma; q5_1's minimum chains run in one register, lane (i, a) =
// fma(m_w[i], s_x[a], .), the scalar chain of dot_act lane by lane. Same bits as gemm_tile256.
struct alignas(32) Unit32 {
  uint8_t bytes[32];
};
struct Act256Tables {
  const uint8_t* q;     // [chunk][b][row][32] activation quants
  const float* dx;      // [chunk][b][row] d_x
  const float* sx;      // [chunk][b][row] s_x (q5_1; read 4 at a time, so zero-padded past the end)
  const int32_t* corr;  // [chunk][b][row][8] -kCorr * sum4(y) (kCorr types that need it)
};

#define MK_GEMM_TILE256T(FN, ATTR, IS_VNNI, dpbusd)                                                                   \
  template <GemmKind K, int NA>                                                                               \
  ATTR inline void FN(const uint8_t* w0, const uint8_t* w1, const Act256Tables& t, int64_t nb, float* out) {  \
    using L = GemmLayout<K>;                                                                                  \
    constexpr bool kUseCorr = L::kCorr != 0;                                                                  \
    __m256 acc[2][NA];                                                                                        \
    __m256 summs = _mm256_setzero_ps(); /* lane 4 i + a: row i's chain with activation row a */               \
    for (int i = 0; i < 2; ++i)                                                                               \
      for (int a = 0; a < NA; ++a) acc[i][a] = _mm256_setzero_ps();                                           \
    const uint8_t* wr[2] = {w0, w1};                                                                          \
    for (int64_t b = 0; b < nb; ++b) {                                                                        \
      __m256i u[2];                                                                                           \
      __m256 dw[2];                                                                                           \
      for (int i = 0; i < 2; ++i) {                                                                           \
        const uint8_t* p = wr[i] + b * L::kBytes;                                                             \
        dw[i] = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(ld_u16(p))));                               \
        u[i] = nibble_block_u8<K>(p);                                                                         \
      }                                                                                                       \
      const uint8_t* yb = t.q + b * NA * 32;                                                                  \
      for (int a = 0; a < NA; ++a) {                                                                          \
        const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb + 32 * a));                 \
        const __m256 dx = _mm256_broadcast_ss(t.dx + b * NA + a);                                             \
        __m256i base = _mm256_setzero_si256();                                                                \
        if constexpr (kUseCorr) base = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.corr + (b * NA + a) * 8)); \
        for (int i = 0; i < 2; ++i) {                                                                         \
          const __m256i isum = dpbusd(base, u[i], qy);                                                        \
          const __m256 s = _mm256_mul_ps(dw[i], dx);                                                          \
          acc[i][a] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(isum), acc[i][a]);                                \
        }                                                                                                     \
      }                                                                                                       \
    }                                                                                                         \
    if constexpr (L::kMin) /* a pass of its own: 16 registers hold the main loop's state without it */    \
      for (int64_t b = 0; b < nb; ++b) {                                                                      \
        const __m256 mw = _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_set1_epi16(static_cast<short>(ld_u16(w0 + b * L::kBytes + 2))), \
                                                             _mm_set1_epi16(static_cast<short>(ld_u16(w1 + b * L::kBytes + 2))))); \
        summs = _mm256_fmadd_ps(mw, _mm256_broadcast_ps(reinterpret_cast<const __m128*>(t.sx + b * NA)), summs); \
      }                                                                                                       \
    alignas(32) float sm[8];                                                                                  \
    _mm256_store_ps(sm, summs);                                                                               \
    for (int i = 0; i < 2; ++i)                                                                               \
      for (int a = 0; a < NA; ++a)                                                                            \
        out[i * NA + a] = L::kMin ? hsum_float_8(acc[i][a]) + sm[4 * i + a] : hsum_float_8(acc[i][a]);        \
  }                                                                                                           \
  /* gemm_act over FN: the tables, then weight rows in pairs (the last paired with itself) against each */   \
  /* chunk of up to 4 activation rows; the pair after next is prefetched. */                                  \
  template <GemmKind K>                                                                                       \
  ATTR void FN##_rows(const void* w, size_t w_stride, int64_t nw, const void* xq, size_t x_stride, int64_t na, \
                      int64_t n, float* out, int64_t ldo) {                                                   \
    using L = GemmLayout<K>;                                                                                  \
    constexpr bool kUseCorr = L::kCorr != 0;                                                                  \
    const uint8_t* wb = static_cast<const uint8_t*>(w);                                                       \
    const uint8_t* xb = static_cast<const uint8_t*>(xq);                                                      \
    const int64_t nb = n / 32;                                                                                \
    const size_t n_ab = static_cast<size_t>(na * nb);                                                         \
    thread_local std::vector<Unit32> buf; /* q (1 per entry), corr (1), dx and sx (1 per 8, + padding) */     \
    const size_t units = n_ab * (kUseCorr ? 2 : 1) + 2 * (n_ab / 8 + 2);                                      \
    if (buf.size() < units) buf.resize(units);                                                                \
    uint8_t* qt = reinterpret_cast<uint8_t*>(buf.data());                                                     \
    int32_t* ct = reinterpret_cast<int32_t*>(buf.data() + n_ab);                                              \
    float* dxt = reinterpret_cast<float*>(buf.data() + n_ab * (kUseCorr ? 2 : 1));                            \
    float* sxt = dxt + 8 * (n_ab / 8 + 2);                                                                    \
    for (int64_t a0 = 0; a0 < na; a0 += 4) {                                                                  \
      const int64_t cols = std::min<int64_t>(4, na - a0);                                                     \
      for (int64_t b = 0; b < nb; ++b)                                                                        \
        for (int64_t a = 0; a < cols; ++a) {                                                                  \
          const uint8_t* yb = xb + static_cast<size_t>(a0 + a) * x_stride + static_cast<size_t>(b) * L::kXBytes; \
          const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb + L::kXQs));              \
          const int64_t k = a0 * nb + b * cols + a; /* [chunk][b][row] */                                     \
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(qt + 32 * k), qy);                                   \
          dxt[k] = ld_f16c(yb);                                                                               \
          if constexpr (L::kMin) sxt[k] = ld_f16c(yb + 2);                                                    \
          if constexpr (kUseCorr)                                                                             \
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(ct + 8 * k),                                       \
                                _mm256_sub_epi32(_mm256_setzero_si256(),                                      \
                                                 dpbusd(_mm256_setzero_si256(),                               \
                                                        _mm256_set1_epi8(static_cast<char>(L::kCorr)), qy))); \
        }                                                                                                     \
    }                                                                                                         \
    for (int i = 0; i < 4; ++i) sxt[n_ab + i] = 0; /* s_x past a short last chunk's last block */            \
    for (int64_t i0 = 0; i0 < nw; i0 += 2) {                                                                  \
      const int rows = static_cast<int>(std::min<int64_t>(2, nw - i0));                                       \
      const uint8_t* w0 = wb + static_cast<size_t>(i0) * w_stride;                                            \
      const uint8_t* w1 = wb + static_cast<size_t>(i0 + rows - 1) * w_stride;                                 \
      prefetch_bytes(w0 + 4 * w_stride, 2 * w_stride); /* the pair after next */                              \
      for (int64_t a0 = 0; a0 < na; a0 += 4) {                                                                \
        const int cols = static_cast<int>(std::min<int64_t>(4, na - a0));                                     \
        const Act256Tables t{qt + 32 * a0 * nb, dxt + a0 * nb, sxt + a0 * nb,                                 \
                             kUseCorr ? ct + 8 * a0 * nb : nullptr};                                          \
        float r[2 * 4];                                                                                       \
        switch (cols) {                                                                                       \
          case 1: FN<K, 1>(w0, w1, t, nb, r); break;                                                          \
          case 2: FN<K, 2>(w0, w1, t, nb, r); break;                                                          \
          case 3: FN<K, 3>(w0, w1, t, nb, r); break;                                                          \
          default: FN<K, 4>(w0, w1, t, nb, r); break;                                                         \
        }                                                                                                     \
        for (int i = 0; i < rows; ++i)                                                                        \
          for (int a = 0; a < cols; ++a) out[(a0 + a) * ldo + i0 + i] = r[i * cols + a];                      \
      }                                                                                                       \
    }                                                                                                         \
  }
MK_GEMM_TILE256T(gemm_tile256t_avx2, MK_AVX2_FN, false, dpbusd256_avx2)
MK_GEMM_TILE256T(gemm_tile256t_avxvnni, MK_AVXVNNI_FN, true, dpbusd256_avxvnni)

// ---- 512-bit tiles (AVX-512 VNNI): NP pairs of weight rows x NA activation rows (up to 8), two
// weight rows per register (low half row 2p, high half row 2p + 1) against the activation block
// broadcast to both halves; per (pair, activation row, block) vpdpbusd, the scale product
// [d_w0 d_x x 8 | d_w1 d_x x 8] (one multiply), convert, fma. The activation rows' quants, f32
// scales and (q5_0) corrections come from per-call tables packed block by block ([b][a]:
// one pointer for all activation rows, none to keep per row), the quants and corrections already
// doubled to 512 bits (a plain load, where a 256-to-512-bit broadcast costs vector-unit work on Zen 4:
// ~10% of the tile). q5_1's minimum terms are left to gemm_rows512p (a separate
// pass, vectorised over activation rows).
//   yc: [nb][NA][64] activation quants, twice; dxc: [nb][NA] activation scales; cc: [nb][NA][16]
//   int32 -kCorr * sum4(y), twice (kCorr types only); out[(2p + h) * NA + a] = dot of weight row 2p + h.
template <GemmKind K, int NP, int NA>
MK_AVX512VNNI_FN inline void gemm_tile512p(const uint8_t* const* w, const uint8_t* yc, const float* dxc,
                                           const int32_t* cc, int64_t nb, float* out, const uint8_t* pf) {
  using L = GemmLayout<K>;
  __m512 acc[NP][NA];
  for (int p = 0; p < NP; ++p)
    for (int a = 0; a < NA; ++a) acc[p][a] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // pf: weight bytes a later tile reads, fetched ahead (2*NP rows' worth per block), where the
    // hardware prefetcher alone leaves a streaming one-row decode latency-bound
    for (int l = 0; l < (2 * NP * L::kBytes + 63) / 64; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(pf + (b * 2 * NP * L::kBytes) + 64 * l), _MM_HINT_T0);
    __m512i u[NP];
    __m512 dw[NP];
    for (int p = 0; p < NP; ++p) {
      const uint8_t* p0 = w[2 * p] + b * L::kBytes;
      const uint8_t* p1 = w[2 * p + 1] + b * L::kBytes;
      u[p] = _mm512_inserti64x4(_mm512_castsi256_si512(nibble_block_u8<K>(p0)), nibble_block_u8<K>(p1), 1);
      const __m256i h = _mm256_mask_set1_epi16(_mm256_set1_epi16(static_cast<short>(ld_u16(p0))), 0xff00,
                                               static_cast<short>(ld_u16(p1)));
      dw[p] = _mm512_cvtph_ps(h);
    }
    const uint8_t* yb = yc + b * NA * 64;
    const float* db = dxc + b * NA;
    for (int a = 0; a < NA; ++a) {
      const __m512i qy = _mm512_loadu_si512(yb + a * 64);
      __m512i base = _mm512_setzero_si512();
      if constexpr (L::kCorr != 0) base = _mm512_loadu_si512(cc + (b * NA + a) * 16);
      for (int p = 0; p < NP; ++p) {
        const __m512i isum = _mm512_dpbusd_epi32(base, u[p], qy);
        acc[p][a] = _mm512_fmadd_ps(_mm512_mul_ps(dw[p], _mm512_set1_ps(db[a])), _mm512_cvtepi32_ps(isum), acc[p][a]);
      }
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int a = 0; a < NA; ++a) {
      const __m256 lo = _mm512_castps512_ps256(acc[p][a]);
      const __m256 hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(acc[p][a], acc[p][a], 0x4e));  // lanes 8..15
      out[(2 * p) * NA + a] = hsum_float_8(lo);
      out[(2 * p + 1) * NA + a] = hsum_float_8(hi);
    }
}

template <GemmKind K, int NA>
MK_AVX512VNNI_FN void gemm_tile512p_na(const uint8_t* const* w, const uint8_t* yc, const float* dxc, const int32_t* cc,
                                       int64_t nb, float* out, const uint8_t* pf) {
  gemm_tile512p<K, 2, NA>(w, yc, dxc, cc, nb, out, pf);
}

// gemm_act with gemm_tile512p: the activation rows packed once per call in chunks of up to 8
// ([chunk][b][row] quants, scales, corrections), then weight rows in groups of 4 (the last padded by
// repeating its last row) against each chunk; for q5_1, out += the fma chain of m_w * s_x over
// the blocks, 16 activation rows per register (the same scalar chain per lane, added last as dot_act
// adds it).
template <GemmKind K>
MK_AVX512VNNI_FN void gemm_rows512p(const void* w, size_t w_stride, int64_t nw, const void* xq, size_t x_stride,
                                    int64_t na, int64_t n, float* out, int64_t ldo) {
  using L = GemmLayout<K>;
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  const uint8_t* xb = static_cast<const uint8_t*>(xq);
  const int64_t nb = n / 32, na16 = (na + 15) / 16 * 16;
  thread_local std::vector<float> tables;  // quants, scales, corrections, (q5_1) s_x [nb][na16]
  const size_t n_y = static_cast<size_t>(na * nb * 16), n_dx = static_cast<size_t>(na * nb);
  const size_t n_c = L::kCorr != 0 ? static_cast<size_t>(na * nb * 16) : 0, n_s = L::kMin ? static_cast<size_t>(nb * na16) : 0;
  tables.resize(n_y + n_dx + n_c + n_s + 16);
  float* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(tables.data()) + 63) & ~uintptr_t{63});
  uint8_t* yt = reinterpret_cast<uint8_t*>(base);
  float* dxt = base + n_y;
  int32_t* ct = reinterpret_cast<int32_t*>(dxt + n_dx);
  float* sxt = dxt + n_dx + n_c;
  for (int64_t a0 = 0; a0 < na; a0 += 8) {
    const int64_t cols = std::min<int64_t>(8, na - a0);
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t a = 0; a < cols; ++a) {
        const uint8_t* yb = xb + static_cast<size_t>(a0 + a) * x_stride + static_cast<size_t>(b) * L::kXBytes;
        const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb + L::kXQs));
        const int64_t k = a0 * nb + b * cols + a;  // [chunk][b][row]
        _mm512_storeu_si512(yt + k * 64, _mm512_broadcast_i64x4(qy));
        dxt[k] = ld_f16c(yb);
        if constexpr (L::kCorr != 0)
          _mm512_storeu_si512(ct + k * 16, _mm512_broadcast_i64x4(_mm256_sub_epi32(
                                               _mm256_setzero_si256(),
                                               _mm256_dpbusd_epi32(_mm256_setzero_si256(),
                                                                   _mm256_set1_epi8(static_cast<char>(L::kCorr)), qy))));
        if constexpr (L::kMin) sxt[b * na16 + a0 + a] = ld_f16c(yb + 2);
      }
  }
  if constexpr (L::kMin)
    for (int64_t b = 0; b < nb; ++b) std::fill(sxt + b * na16 + na, sxt + (b + 1) * na16, 0.0f);
  using Tile = void (*)(const uint8_t* const*, const uint8_t*, const float*, const int32_t*, int64_t, float*,
                        const uint8_t*);
  constexpr Tile tiles[8] = {gemm_tile512p_na<K, 1>, gemm_tile512p_na<K, 2>, gemm_tile512p_na<K, 3>,
                             gemm_tile512p_na<K, 4>, gemm_tile512p_na<K, 5>, gemm_tile512p_na<K, 6>,
                             gemm_tile512p_na<K, 7>, gemm_tile512p_na<K, 8>};
  for (int64_t i0 = 0; i0 < nw; i0 += 4) {
    const int rows = static_cast<int>(std::min<int64_t>(4, nw - i0));
    const uint8_t* wr[4];
    for (int i = 0; i < 4; ++i) wr[i] = wb + static_cast<size_t>(i0 + std::min(i, rows - 1)) * w_stride;
    for (int64_t a0 = 0; a0 < na; a0 += 8) {
      const int cols = static_cast<int>(std::min<int64_t>(8, na - a0));
      float t[4 * 8];
      // two groups of 4 rows ahead (prefetches never fault: past the matrix they are dropped)
      tiles[cols - 1](wr, yt + a0 * nb * 64, dxt + a0 * nb, ct + a0 * nb * 16, nb, t, wr[0] + 8 * w_stride);
      for (int i = 0; i < rows; ++i)
        for (int a = 0; a < cols; ++a) out[(a0 + a) * ldo + i0 + i] = t[i * cols + a];
    }
    if constexpr (L::kMin)  // four independent chains (one per weight row) hide the fma latency
      for (int64_t a0 = 0; a0 < na; a0 += 16) {
        __m512 summs[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t b = 0; b < nb; ++b) {
          const __m512 sx = _mm512_loadu_ps(sxt + b * na16 + a0);
          for (int i = 0; i < 4; ++i)
            summs[i] = _mm512_fmadd_ps(_mm512_set1_ps(ld_f16c(wr[i] + b * L::kBytes + 2)), sx, summs[i]);
        }
        for (int i = 0; i < rows; ++i) {
          alignas(64) float s16[16];
          _mm512_store_ps(s16, summs[i]);
          for (int64_t a = a0; a < std::min(na, a0 + 16); ++a) out[a * ldo + i0 + i] = out[a * ldo + i0 + i] + s16[a - a0];
        }
      }
  }
}

// The gemm_act of quant.h from a tile function: weight rows in groups of RW (the last group padded
// by repeating its last row), activation rows in groups of up to 4; blocks of QK elements.
template <int RW, int QK, void (*T1)(const uint8_t* const*, const uint8_t* const*, int64_t, float*),
          void (*T2)(const uint8_t* const*, const uint8_t* const*, int64_t, float*),
          void (*T3)(const uint8_t* const*, const uint8_t* const*, int64_t, float*),
          void (*T4)(const uint8_t* const*, const uint8_t* const*, int64_t, float*)>
inline void gemm_rows(const void* w, size_t w_stride, int64_t nw, const void* xq, size_t x_stride, int64_t na,
                      int64_t n, float* out, int64_t ldo) {
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  const uint8_t* xb = static_cast<const uint8_t*>(xq);
  for (int64_t i0 = 0; i0 < nw; i0 += RW) {
    const int rows = static_cast<int>(std::min<int64_t>(RW, nw - i0));
    const uint8_t* wr[RW];
    for (int i = 0; i < RW; ++i) wr[i] = wb + static_cast<size_t>(i0 + std::min(i, rows - 1)) * w_stride;
    prefetch_bytes(wr[0] + 2 * RW * w_stride, RW * w_stride);  // the group after next
    for (int64_t a0 = 0; a0 < na; a0 += 4) {
      const int cols = static_cast<int>(std::min<int64_t>(4, na - a0));
      const uint8_t* yr[4];
      for (int a = 0; a < cols; ++a) yr[a] = xb + static_cast<size_t>(a0 + a) * x_stride;
      float t[RW * 4];
      switch (cols) {
        case 1: T1(wr, yr, n / QK, t); break;
        case 2: T2(wr, yr, n / QK, t); break;
        case 3: T3(wr, yr, n / QK, t); break;
        default: T4(wr, yr, n / QK, t); break;
      }
      for (int i = 0; i < rows; ++i)
        for (int a = 0; a < cols; ++a) out[(a0 + a) * ldo + i0 + i] = t[i * cols + a];
    }
  }
}

}  // namespace mk::quant::detail

// FN: the gemm_act of gemm_rows<RW, QK> over TILE<1> .. TILE<4> (TILE<NA>: RW weight rows x NA
// activation rows).
#define MK_QUANT_GEMM_ROWS(FN, RW, QK, TILE)                                                                  \
  void FN(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n, float* out,  \
          int64_t ldo) {                                                                                      \
    ::mk::quant::detail::gemm_rows<RW, QK, TILE<1>, TILE<2>, TILE<3>, TILE<4>>(w, ws, nw, x, xs, na, n, out,  \
                                                                               ldo);                          \
  }

// NAME_generic (dot_act per pair through DOT_ACT_GENERIC) and NAME, which picks one of NAME_generic,
// NAME_avx2, NAME_avxvnni, NAME_avx512vnni, AMX_FN once (gemm_isa; AMX_FN is NAME_avx512vnni for the
// types without an AMX tile).
#define MK_QUANT_GEMM_GENERIC_AND_PICK(NAME, DOT_ACT_GENERIC, AMX_FN)                                                  \
  void NAME##_generic(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,  \
                      float* out, int64_t ldo) {                                                              \
    for (int64_t i = 0; i < nw; ++i)                                                                          \
      for (int64_t a = 0; a < na; ++a)                                                                        \
        out[a * ldo + i] = DOT_ACT_GENERIC(static_cast<const uint8_t*>(w) + i * ws,                           \
                                           static_cast<const uint8_t*>(x) + a * xs, n);                       \
  }                                                                                                           \
  void NAME(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n, float* out, \
            int64_t ldo) {                                                                                    \
    static const ::mk::quant::GemmIsa isa = ::mk::quant::gemm_isa();                                          \
    switch (isa) {                                                                                            \
      case ::mk::quant::GemmIsa::amx: return AMX_FN(w, ws, nw, x, xs, na, n, out, ldo);                      \
      case ::mk::quant::GemmIsa::avx512vnni: return NAME##_avx512vnni(w, ws, nw, x, xs, na, n, out, ldo);     \
      case ::mk::quant::GemmIsa::avxvnni: return NAME##_avxvnni(w, ws, nw, x, xs, na, n, out, ldo);           \
      case ::mk::quant::GemmIsa::avx2: return NAME##_avx2(w, ws, nw, x, xs, na, n, out, ldo);                 \
      default: return NAME##_generic(w, ws, nw, x, xs, na, n, out, ldo);                                      \
    }                                                                                                         \
  }

// Defines NAME_avx2, NAME_avxvnni, NAME_avx512vnni (gemm_act variants for weight kind KIND) and
// NAME_generic (dot_act per pair through DOT_ACT_GENERIC), plus NAME, which picks one once.
#define MK_QUANT_GEMM_ACT(NAME, KIND, DOT_ACT_GENERIC)                                                         \
  template <int NA>                                                                                           \
  MK_AVX2_FN void NAME##_t_avx2(const uint8_t* const* w, const uint8_t* const* y, int64_t nb, float* o) {     \
    ::mk::quant::detail::gemm_tile256_avx2<KIND, 2, NA>(w, y, nb, o);                                       \
  }                                                                                                           \
  template <int NA>                                                                                           \
  MK_AVXVNNI_FN void NAME##_t_avxvnni(const uint8_t* const* w, const uint8_t* const* y, int64_t nb, float* o) { \
    ::mk::quant::detail::gemm_tile256_avxvnni<KIND, 2, NA>(w, y, nb, o);                                        \
  }                                                                                                           \
  /* one activation row (decode): the 2 x 1 tile (only TILE<1> is instantiated: gemm_rows never picks */  \
  /* a wider one for a single row); more: the tiles over activation tables */                                \
  void NAME##_one_avx2(const void* w, size_t ws, int64_t nw, const void* x, int64_t n, float* out) {          \
    ::mk::quant::detail::gemm_rows<2, 32, NAME##_t_avx2<1>, NAME##_t_avx2<1>, NAME##_t_avx2<1>,              \
                                   NAME##_t_avx2<1>>(w, ws, nw, x, 0, 1, n, out, nw);                        \
  }                                                                                                           \
  void NAME##_one_avxvnni(const void* w, size_t ws, int64_t nw, const void* x, int64_t n, float* out) {       \
    ::mk::quant::detail::gemm_rows<2, 32, NAME##_t_avxvnni<1>, NAME##_t_avxvnni<1>, NAME##_t_avxvnni<1>,     \
                                   NAME##_t_avxvnni<1>>(w, ws, nw, x, 0, 1, n, out, nw);                     \
  }                                                                                                           \
  void NAME##_avx2(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,     \
                   float* out, int64_t ldo) {                                                                 \
    if (na == 1) return NAME##_one_avx2(w, ws, nw, x, n, out);                                                \
    ::mk::quant::detail::gemm_tile256t_avx2_rows<KIND>(w, ws, nw, x, xs, na, n, out, ldo);                   \
  }                                                                                                           \
  void NAME##_avxvnni(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,  \
                      float* out, int64_t ldo) {                                                              \
    if (na == 1) return NAME##_one_avxvnni(w, ws, nw, x, n, out);                                             \
    ::mk::quant::detail::gemm_tile256t_avxvnni_rows<KIND>(w, ws, nw, x, xs, na, n, out, ldo);                \
  }                                                                                                           \
  void NAME##_avx512vnni(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na,          \
                         int64_t n, float* out, int64_t ldo) {                                                \
    /* one q5_1 activation row: the 256-bit tile is faster (no separate pass for the minimum terms) */       \
    if (::mk::quant::detail::GemmLayout<KIND>::kMin && na == 1)                                               \
      return NAME##_avx2(w, ws, nw, x, xs, na, n, out, ldo);                                                  \
    ::mk::quant::detail::gemm_rows512p<KIND>(w, ws, nw, x, xs, na, n, out, ldo);                              \
  }                                                                                                           \
  MK_QUANT_GEMM_GENERIC_AND_PICK(NAME, DOT_ACT_GENERIC, NAME##_avx512vnni)
