// gemm_act for q4_0, q4_1 and q8_0 weights on Intel AMX (AMX-INT8: TDPBSSD / TDPBSUD on 16 x 64-byte
// tiles; Intel SDM vol. 1 ch. 18, "Intel Advanced Matrix Extensions"), with the same block-integer
// numerics and bits as every other variant (quant.h dot_act; blockint_x86.h): per 32-element block
// the exact int32 dot, then acc = fma(d_w * d_x, float(dot), acc) in block order, q4_1 also summs =
// fma(m_w, s_x, summs), dot = acc (+ summs).
//
// One TDPB* multiplies a 16 x 32-byte activation tile A (16 activation rows, one block each) by a
// 32 x 16 weight tile B (one block of 16 weight rows, laid out as 8 rows of 16 dwords: B row k holds
// elements 4k..4k+3 of each weight row, exactly what blockint_x86.h's gathers produce, one weight row
// per lane) into C = the 256 exact block dots, 8192 multiply-adds per instruction. The float work is
// what the spec asks, one multiply and one fma per (activation row, weight row, block), 16 lanes at a
// time, from C stored to L1. Weights: q8_0's bytes and q4_0's nibbles minus 8 as signed bytes
// (TDPBSSD), q4_1's nibbles as unsigned ones (TDPBSUD). Per call the activation blocks are staged
// once into 16-row tiles (zero rows past the last), and per group of 16 weight rows the weight tiles
// of every block are built once into an L1/L2 buffer, then reused by each activation group.
//
// Needs the kernel's permission for the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked once by
// gemm_isa() in quant.cpp); each call loads the tile configuration and ends with tilerelease.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "quant/blockint_x86.h"

#define MK_AMX_FN \
  __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,bmi2")))

namespace mk::quant::detail {

// ldtilecfg's 64-byte operand (palette 1): tiles 0-3 = C (16 x 64 bytes of int32), 4, 5 = A (16
// rows x 32 bytes), 6, 7 = B (8 rows x 64 bytes).
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 32, 32, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 8, 8};
};

// GCC's tile intrinsics are asm statements that do not tell the compiler which memory they read or
// write: a compiler barrier between the C++ stores of the tiles' sources and their tileloadd, and
// between tilestored and the C++ loads of its result.
inline void amx_memory_barrier() { asm volatile("" ::: "memory"); }

// Loads the tile configuration; each call ends with tilerelease, so that the tile state is back in
// its initial state between calls (a context switch then has no tile data to save).
MK_AMX_FN inline void amx_configure() {
  static const AmxTileConfig cfg;
  _tile_loadconfig(&cfg);
}

// C (tile T) of one block into the 16 accumulators: acc[m] = fma(dw * dx[m], float(C[m]), acc[m]).
#define MK_AMX_SCALE_BLOCK(CBUF, DW, DX)                                                            \
  _Pragma("GCC unroll 16") for (int m = 0; m < 16; ++m) {                                                                 \
    const __m512 c = _mm512_cvtepi32_ps(_mm512_load_si512((CBUF) + 16 * m));                     \
    acc[m] = _mm512_fmadd_ps(_mm512_mul_ps((DW), _mm512_set1_ps((DX)[m])), c, acc[m]);           \
  }

// gemm_act on an AMX machine takes the AVX-512 VNNI tile below this many activation rows. Measured
// 2026-12-03 (Intel Xeon VM, 2 vCPU, SmolLM2 Q4_1, interleaved A/B): 16-stream serve decode 5-8%
// faster with the AMX tiles (weight tiles built block by block), a 280-token prompt 7-10% faster;
// at 4 rows and below BM_QuantGemm has the AMX tile well behind the VNNI one.
inline constexpr int64_t kAmxMinRows = 16;

// Packed weights (quant.h QuantType::pack): per group of 16 rows (the last group padded with copies
// of the matrix's last row) and block, kWV + 1 vectors of 64 bytes: vector k < kWV holds quant dword k
// of each row (lane r = row r), vector kWV each row's first block dword (d, and m for q4_1). This is
// what the gather tiles fetch per block (and keep in MODE 1), so the VNNI tile reads it with plain
// loads (MODE 2), and q8_0's 8 quant vectors are AMX's B tile as they lie.
template <BiKind K>
inline constexpr size_t kBiPackedBlock = static_cast<size_t>(BiLayout<K>::kWV + 1) * 64;
template <BiKind K>
inline size_t bi_packed_bytes(int64_t nw, int64_t n) {
  return static_cast<size_t>((nw + 15) / 16) * static_cast<size_t>(n / 32) * kBiPackedBlock<K>;
}
template <BiKind K>
inline void bi_pack(const void* w, size_t ws, int64_t nw, int64_t n, void* dst) {
  using L = BiLayout<K>;
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  uint8_t* o = static_cast<uint8_t*>(dst);
  const int64_t nb = n / 32;
  for (int64_t g = 0; g < (nw + 15) / 16; ++g)
    for (int64_t b = 0; b < nb; ++b, o += kBiPackedBlock<K>)
      for (int r = 0; r < 16; ++r) {
        const uint8_t* blk = wb + static_cast<size_t>(std::min<int64_t>(g * 16 + r, nw - 1)) * ws + b * L::kBytes;
        for (int k = 0; k < L::kWV; ++k) std::memcpy(o + k * 64 + 4 * r, blk + L::kQs + 4 * k, 4);
        std::memcpy(o + L::kWV * 64 + 4 * r, blk, 4);
      }
}

// gemm_act on packed weights with the AVX-512 VNNI tile (MODE 2: the group's vectors as loads): wp
// the group of the tile's first row, nw rows; otherwise as bi_tile512_rows (the same bits).
template <BiKind K>
MK_AVX512VNNI_FN void bi_tile512_packed_rows(const void* wp, int64_t nw, const void* xq, size_t xs, int64_t na,
                                             int64_t n, float* out, int64_t ldo) {
  using L = BiLayout<K>;
  const uint8_t* xb = static_cast<const uint8_t*>(xq);
  const int64_t nb = n / 32;
  const size_t gb = static_cast<size_t>(nb) * kBiPackedBlock<K>;
  const BiActTables tab = bi_act_tables_all<K>(xb, xs, na, nb);
  float* dx = tab.dx;
  float* sx = tab.sx;
  int32_t* corr = tab.corr;
  alignas(64) static const int32_t off[16] = {};
  for (int64_t i0 = 0; i0 < nw; i0 += 16) {
    const int rows = static_cast<int>(std::min<int64_t>(16, nw - i0));
    uint8_t* g = const_cast<uint8_t*>(static_cast<const uint8_t*>(wp)) + static_cast<size_t>(i0 / 16) * gb;  // read only
    for (int64_t a0 = 0; a0 < na; a0 += 8) {
      const int cols = static_cast<int>(std::min<int64_t>(8, na - a0));
      const uint8_t* y[8];
      for (int a = 0; a < cols; ++a) y[a] = xb + static_cast<size_t>(a0 + a) * xs;
      alignas(64) float t[8 * 16];
      // the group after next, prefetched block by block by the first activation chunk
      const uintptr_t pf = a0 == 0 && i0 + 32 < nw ? reinterpret_cast<uintptr_t>(g + 2 * gb) : 0;
      bi_tile512_na<K, 2>(cols, g, off, y, dx + a0 * nb, sx + a0 * nb, L::kCorr != 0 ? corr + a0 * nb : nullptr, nb, pf,
                          0, g, t);
      // one masked vector store per activation row (a variable-length copy became rep movs: ~5% of the
      // tile in a 16-row SmolLM2 step on Zen 4)
      const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
      for (int a = 0; a < cols; ++a) _mm512_mask_storeu_ps(out + (a0 + a) * ldo + i0, keep, _mm512_load_ps(t + a * 16));
    }
  }
}

// The weight tile of block b of the 16 rows at g (one row per lane, ix) into wt + b * 512 (q4_0:
// nibbles - 8), its d_w and m_w into wdw / wmw + b * 16; prefetches the rows at pf (0: none). P: g is
// a packed group instead (loads, no gathers; q8_0's quants are then used where they lie, not copied).
template <BiKind K, bool P = false>
[[gnu::always_inline]] MK_AMX_FN inline void bi_amx_build(const uint8_t* g, const BiIdx512& ix, int64_t b, uintptr_t pf,
                                                          size_t ws, uint8_t* wt, float* wdw, float* wmw) {
  using L = BiLayout<K>;
  constexpr bool kSigned = K != BiKind::q4_1;
  const __m512i m4 = _mm512_set1_epi8(0x0f), k8 = _mm512_set1_epi8(8);
  uint8_t* t = wt + b * 512;
  if constexpr (P) {
    const uint8_t* pb = g + static_cast<size_t>(b) * kBiPackedBlock<K>;
    if (pf != 0)  // the same block of the next group (pf), spread over the blocks' work
      for (size_t q = 0; q < kBiPackedBlock<K>; q += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pf + static_cast<size_t>(b) * kBiPackedBlock<K> + q), _MM_HINT_T0);
    if constexpr (L::kNib)
      for (int k = 0; k < 4; ++k) {
        const __m512i c = _mm512_loadu_si512(pb + k * 64);
        __m512i lo = _mm512_and_si512(c, m4), hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), m4);
        if constexpr (kSigned) lo = _mm512_sub_epi8(lo, k8), hi = _mm512_sub_epi8(hi, k8);
        _mm512_storeu_si512(t + k * 64, lo);
        _mm512_storeu_si512(t + (4 + k) * 64, hi);
      }
    __m512 dw, mw;
    bi_scales512(_mm512_loadu_si512(pb + L::kWV * 64), dw, mw);
    _mm512_storeu_ps(wdw + b * 16, dw);
    if constexpr (L::kMin) _mm512_storeu_ps(wmw + b * 16, mw);
    return;
  }
  const uint8_t* blk = g + b * L::kBytes;
  if (pf != 0 && b % (64 / L::kBytes) == 0)
    for (int r = 0; r < 16; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(pf + r * ws + static_cast<uintptr_t>(b * L::kBytes)), _MM_HINT_T0);
  for (int k = 0; k < L::kWV; k += 2) {
    __m512i c0, c1;
    bi_gather2_512(blk + L::kQs + 4 * k, ix, c0, c1);
    if constexpr (L::kNib) {  // dwords k < 4: elements 4k.. (low nibbles) and 16 + 4k.. (high)
      __m512i lo0 = _mm512_and_si512(c0, m4), hi0 = _mm512_and_si512(_mm512_srli_epi16(c0, 4), m4);
      __m512i lo1 = _mm512_and_si512(c1, m4), hi1 = _mm512_and_si512(_mm512_srli_epi16(c1, 4), m4);
      if constexpr (kSigned) {
        lo0 = _mm512_sub_epi8(lo0, k8), hi0 = _mm512_sub_epi8(hi0, k8);
        lo1 = _mm512_sub_epi8(lo1, k8), hi1 = _mm512_sub_epi8(hi1, k8);
      }
      _mm512_storeu_si512(t + k * 64, lo0);
      _mm512_storeu_si512(t + (k + 1) * 64, lo1);
      _mm512_storeu_si512(t + (4 + k) * 64, hi0);
      _mm512_storeu_si512(t + (5 + k) * 64, hi1);
    } else {
      _mm512_storeu_si512(t + k * 64, c0);
      _mm512_storeu_si512(t + (k + 1) * 64, c1);
    }
  }
  __m512 dw, mw;
  bi_scales512(bi_gather512(blk, ix), dw, mw);
  _mm512_storeu_ps(wdw + b * 16, dw);
  if constexpr (L::kMin) _mm512_storeu_ps(wmw + b * 16, mw);
}

// P: w is packed (QuantType::pack; ws unused), else GGUF rows ws bytes apart.
template <BiKind K, bool P = false>
MK_AMX_FN void bi_amx_rows(const void* w, size_t ws, int64_t nw, const void* xq, size_t xs, int64_t na, int64_t n,
                           float* out, int64_t ldo) {
  using L = BiLayout<K>;
  constexpr bool kSigned = K != BiKind::q4_1;  // TDPBSSD on signed weights, TDPBSUD on q4_1's nibbles
  const uint8_t* wb = static_cast<const uint8_t*>(w);
  const uint8_t* xb = static_cast<const uint8_t*>(xq);
  if (na <= 0 || nw <= 0) return;
  const int64_t nb = n / 32, ng = (na + 15) / 16;
  // Activation tiles [group][block] (16 rows x 32 bytes), their d_x and s_x [group][block][row].
  thread_local std::vector<uint8_t> atiles, wtiles;
  thread_local std::vector<float> ascale, wscale;
  atiles.assign(static_cast<size_t>(ng * nb * 512), 0);
  ascale.assign(static_cast<size_t>(2 * ng * nb * 16), 0.0f);
  float* adx = ascale.data();
  float* asx = adx + ng * nb * 16;
  for (int64_t a = 0; a < na; ++a) {
    const int64_t g = a / 16, m = a % 16;
    const uint8_t* y = xb + static_cast<size_t>(a) * xs;
    for (int64_t b = 0; b < nb; ++b, y += L::kXBytes) {
      std::memcpy(atiles.data() + (g * nb + b) * 512 + m * 32, y + L::kXQs, 32);
      adx[(g * nb + b) * 16 + m] = ld_f16(y);
      if constexpr (L::kMin) asx[(g * nb + b) * 16 + m] = ld_f16(y + 2);
    }
  }
  // Weight tiles of one group of 16 rows [block] (8 x 64 bytes), d_w and m_w [block][row].
  wtiles.resize(static_cast<size_t>(nb * 512));
  wscale.resize(static_cast<size_t>(2 * nb * 16));
  float* wdw = wscale.data();
  float* wmw = wdw + nb * 16;
  alignas(64) int32_t cbuf[4][256];
  amx_configure();
  alignas(64) float acc_t[16 * 16];
  for (int64_t i0 = 0; i0 < nw; i0 += 16) {
    const int rows = static_cast<int>(std::min<int64_t>(16, nw - i0));
    alignas(64) int32_t off[16];
    for (int r = 0; r < 16; ++r) off[r] = P ? 0 : static_cast<int32_t>(std::min(r, rows - 1) * static_cast<int64_t>(ws));
    const BiIdx512 ix = bi_idx512(off);
    const size_t gb = static_cast<size_t>(nb) * kBiPackedBlock<K>;  // a packed group's bytes
    const uint8_t* g = P ? wb + static_cast<size_t>(i0 / 16) * gb : wb + static_cast<size_t>(i0) * ws;
    // the group after next: a line per row every 3 blocks or less (addresses as integers, as
    // blockint_x86.h: rows past the matrix are never dereferenced); packed: the next group, whole
    const uintptr_t pf = P ? (i0 + 16 < nw ? reinterpret_cast<uintptr_t>(g + gb) : 0)
                           : (i0 + 32 < nw ? reinterpret_cast<uintptr_t>(g) + 32 * ws : 0);
    // With one activation tile (decode batches) each block's weight tile is built kAhead blocks
    // before its dot, so the gathers overlap the tile and float work and its stores are done when
    // tileloadd reads them; with more, all blocks first (reused).
    const bool fused = ng == 1;
    constexpr int64_t kAhead = P && !L::kNib ? 0 : 4;  // fused: block b + kAhead's weight tile is built with block b's dot
    if (!fused)
      for (int64_t b = 0; b < nb; ++b) bi_amx_build<K, P>(g, ix, b, pf, ws, wtiles.data(), wdw, wmw);
    amx_memory_barrier();  // the tiles built above are read by tileloadd below
    for (int64_t g0 = 0; g0 < ng; ++g0) {
      const uint8_t* at = atiles.data() + g0 * nb * 512;
      const uint8_t* wt = wtiles.data();
      const float* dx = adx + g0 * nb * 16;
      const int mrows = static_cast<int>(std::min<int64_t>(16, na - g0 * 16));
      constexpr bool kDirectB = P && !L::kNib;  // packed q8_0: B tiles straight from the weights
      __m512 acc[16];
#pragma GCC unroll 16
      for (int m = 0; m < 16; ++m) acc[m] = _mm512_setzero_ps();
      // Two blocks in flight ahead of the float work: block bb's dot goes to C tile bb % 4 (A tiles 4,
      // 5 and B tiles 6, 7 alternate), is stored into cbuf[bb % 4] two blocks later and scaled one
      // block after that, in block order.
#define MK_AMX_TILE(BB, C, A, B)                                  \
  if ((BB) < nb) {                                                \
    if (fused && (BB) + kAhead < nb) {                            \
      bi_amx_build<K, P>(g, ix, (BB) + kAhead, pf, ws, wtiles.data(), wdw, wmw); \
      amx_memory_barrier(); /* read by tileloadd below */         \
    }                                                             \
    _tile_zero(C);                                                \
    _tile_loadd(A, at + (BB) * 512, 32);                          \
    _tile_loadd(B, kDirectB ? g + (BB) * kBiPackedBlock<K> : wt + (BB) * 512, 64); \
    if constexpr (kSigned) _tile_dpbssd(C, A, B);                 \
    else _tile_dpbsud(C, A, B);                                   \
  }
#define MK_AMX_STORE(BB, C)                                       \
  if ((BB) < nb) {                                                \
    amx_memory_barrier(); /* cbuf's earlier reads come first */   \
    _tile_stored(C, cbuf[(BB) % 4], 64);                          \
  }
#define MK_AMX_SCALE(BB)                                          \
  if ((BB) >= 0 && (BB) < nb) {                                   \
    amx_memory_barrier(); /* cbuf is read below */                \
    const __m512 dwv = _mm512_loadu_ps(wdw + (BB) * 16);          \
    MK_AMX_SCALE_BLOCK(cbuf[(BB) % 4], dwv, dx + (BB) * 16)       \
  }
      // Block j: its dot issued two blocks ahead, its C tile stored after the next dot is issued, and
      // scaled (in block order) one block later still, so the stores are done when cbuf is read.
      if (fused) {
        for (int64_t b = 0; b < std::min<int64_t>(kAhead, nb); ++b) bi_amx_build<K, P>(g, ix, b, pf, ws, wtiles.data(), wdw, wmw);
        amx_memory_barrier();
      }
      MK_AMX_TILE(0, 0, 4, 6)
      MK_AMX_TILE(1, 1, 5, 7)
      for (int64_t b = 0; b < nb; b += 4) {
        MK_AMX_TILE(b + 2, 2, 4, 6)
        MK_AMX_STORE(b, 0)
        MK_AMX_SCALE(b - 1)
        MK_AMX_TILE(b + 3, 3, 5, 7)
        MK_AMX_STORE(b + 1, 1)
        MK_AMX_SCALE(b)
        MK_AMX_TILE(b + 4, 0, 4, 6)
        MK_AMX_STORE(b + 2, 2)
        MK_AMX_SCALE(b + 1)
        MK_AMX_TILE(b + 5, 1, 5, 7)
        MK_AMX_STORE(b + 3, 3)
        MK_AMX_SCALE(b + 2)
      }
      if ((nb - 1) % 4 == 3) MK_AMX_SCALE(nb - 1)
#undef MK_AMX_TILE
#undef MK_AMX_STORE
#undef MK_AMX_SCALE
      const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
      if constexpr (L::kMin) {  // then sum over blocks of fma(m_w, s_x, .), its own block-order chain
#pragma GCC unroll 16
        for (int m = 0; m < 16; ++m) _mm512_store_ps(acc_t + 16 * m, acc[m]);
        const float* sx = asx + g0 * nb * 16;
        __m512 sm[16];
#pragma GCC unroll 16
        for (int m = 0; m < 16; ++m) sm[m] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
          const __m512 mwv = _mm512_loadu_ps(wmw + b * 16);
#pragma GCC unroll 16
          for (int m = 0; m < 16; ++m) sm[m] = _mm512_fmadd_ps(mwv, _mm512_set1_ps(sx[b * 16 + m]), sm[m]);
        }
#pragma GCC unroll 16
        for (int m = 0; m < 16; ++m)
          if (m < mrows) _mm512_mask_storeu_ps(out + (g0 * 16 + m) * ldo + i0, keep, _mm512_add_ps(_mm512_load_ps(acc_t + 16 * m), sm[m]));
      } else {
        for (int m = 0; m < mrows; ++m) _mm512_mask_storeu_ps(out + (g0 * 16 + m) * ldo + i0, keep, acc[m]);
      }
    }
  }
  _tile_release();
}
#undef MK_AMX_SCALE_BLOCK

// The gemm_act variants of a block-integer type (quant.h): NAME_avx2, NAME_avxvnni, NAME_avx512vnni,
// NAME_amx (the AMX tiles for any row count: the variant tests and benchmarks call), NAME_generic
// (dot_act per pair through DOT_ACT_GENERIC) and NAME, which picks one once (on AMX machines NAME_amx
// from kAmxMinRows activation rows up, else NAME_avx512vnni).
#define MK_QUANT_GEMM_ACT_BLOCKINT(NAME, KIND, DOT_ACT_GENERIC)                                                  \
  void NAME##_generic(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,    \
                      float* out, int64_t ldo);                                                                 \
  /* the gathers take 15 row strides as int32 offsets: rows of over 128 MiB go the generic way */              \
  constexpr size_t NAME##_max_stride = static_cast<size_t>(INT32_MAX) / 16;                                    \
  void NAME##_avx2(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,       \
                   float* out, int64_t ldo) {                                                                   \
    if (ws > NAME##_max_stride) return NAME##_generic(w, ws, nw, x, xs, na, n, out, ldo);                      \
    ::mk::quant::detail::bi_tile256_avx2_rows<KIND>(w, ws, nw, x, xs, na, n, out, ldo);                         \
  }                                                                                                             \
  void NAME##_avxvnni(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,    \
                      float* out, int64_t ldo) {                                                                \
    if (ws > NAME##_max_stride) return NAME##_generic(w, ws, nw, x, xs, na, n, out, ldo);                      \
    ::mk::quant::detail::bi_tile256_avxvnni_rows<KIND>(w, ws, nw, x, xs, na, n, out, ldo);                      \
  }                                                                                                             \
  void NAME##_avx512vnni(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n, \
                         float* out, int64_t ldo) {                                                             \
    if (ws > NAME##_max_stride) return NAME##_generic(w, ws, nw, x, xs, na, n, out, ldo);                      \
    ::mk::quant::detail::bi_tile512_rows<KIND>(w, ws, nw, x, xs, na, n, out, ldo);                              \
  }                                                                                                             \
  void NAME##_amx(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,        \
                  float* out, int64_t ldo) {                                                                    \
    if (ws > NAME##_max_stride) return NAME##_generic(w, ws, nw, x, xs, na, n, out, ldo);                      \
    ::mk::quant::detail::bi_amx_rows<KIND>(w, ws, nw, x, xs, na, n, out, ldo);                                  \
  }                                                                                                             \
  /* what gemm_act runs on an AMX machine: the tiles from kAmxMinRows activation rows up */                    \
  void NAME##_amx_pick(const void* w, size_t ws, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,   \
                       float* out, int64_t ldo) {                                                               \
    if (na < ::mk::quant::detail::kAmxMinRows) return NAME##_avx512vnni(w, ws, nw, x, xs, na, n, out, ldo);    \
    NAME##_amx(w, ws, nw, x, xs, na, n, out, ldo);                                                              \
  }                                                                                                             \
  MK_QUANT_GEMM_GENERIC_AND_PICK(NAME, DOT_ACT_GENERIC, NAME##_amx_pick)                                       \
  /* packed weights (QuantType::pack): AVX-512 VNNI, AMX, and the pick (AMX from kAmxMinRows rows) */          \
  size_t NAME##_packed_bytes(int64_t nw, int64_t n) { return ::mk::quant::detail::bi_packed_bytes<KIND>(nw, n); } \
  void NAME##_pack(const void* w, size_t ws, int64_t nw, int64_t n, void* dst) {                                \
    ::mk::quant::detail::bi_pack<KIND>(w, ws, nw, n, dst);                                                       \
  }                                                                                                             \
  void NAME##_packed_avx512vnni(const void* wp, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,     \
                                float* out, int64_t ldo) {                                                      \
    ::mk::quant::detail::bi_tile512_packed_rows<KIND>(wp, nw, x, xs, na, n, out, ldo);                          \
  }                                                                                                             \
  void NAME##_packed_amx(const void* wp, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n, float* out, \
                         int64_t ldo) {                                                                         \
    ::mk::quant::detail::bi_amx_rows<KIND, true>(wp, 0, nw, x, xs, na, n, out, ldo);                            \
  }                                                                                                             \
  void NAME##_packed_avx2(const void* wp, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n, float* out, \
                          int64_t ldo) {                                                                        \
    ::mk::quant::detail::bi_tile256_avx2_packed_rows<KIND>(wp, nw, x, xs, na, n, out, ldo);                     \
  }                                                                                                             \
  void NAME##_packed_avxvnni(const void* wp, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n,       \
                             float* out, int64_t ldo) {                                                         \
    ::mk::quant::detail::bi_tile256_avxvnni_packed_rows<KIND>(wp, nw, x, xs, na, n, out, ldo);                  \
  }                                                                                                             \
  void NAME##_packed(const void* wp, int64_t nw, const void* x, size_t xs, int64_t na, int64_t n, float* out,   \
                     int64_t ldo) {                                                                             \
    static const ::mk::quant::GemmIsa isa = ::mk::quant::gemm_isa();                                            \
    if (isa == ::mk::quant::GemmIsa::avx2) return NAME##_packed_avx2(wp, nw, x, xs, na, n, out, ldo);          \
    if (isa == ::mk::quant::GemmIsa::avxvnni) return NAME##_packed_avxvnni(wp, nw, x, xs, na, n, out, ldo);    \
    if (isa == ::mk::quant::GemmIsa::amx && na >= ::mk::quant::detail::kAmxMinRows)                              \
      return NAME##_packed_amx(wp, nw, x, xs, na, n, out, ldo);                                                 \
    NAME##_packed_avx512vnni(wp, nw, x, xs, na, n, out, ldo);                                                   \
  }

}  // namespace mk::quant::detail
