#include "backend/cpu/float_gemm.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/dot_lanes.h"
#include "support/error.h"

// Built with -ffp-contract=off (CMakeLists.txt): every `acc += x * w` below is a rounded multiply
// then a rounded add, as in dot().

namespace mk::cpu {

float dot_f32(const float* a, const float* b, int64_t n) { return dot(a, b, n); }

namespace {

using TileFn = void (*)(const float*, int64_t, const float* const*, int64_t, float*, int64_t, const float* const*, int);

namespace portable {  // 4-float registers (SSE2, NEON) for whatever the build targets
#define MK_TILE_W 4
#include "backend/cpu/float_tile.inc"
}  // namespace portable

// GCC's target pragmas (Clang ignores them: there the portable tile runs on every CPU).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MK_FLOAT_ISA_TILES 1
#else
#define MK_FLOAT_ISA_TILES 0
#endif
#if MK_FLOAT_ISA_TILES
#pragma GCC push_options
#pragma GCC target("arch=haswell")  // AVX2 and nothing wider, even in a -march=native build on an AVX-512 CPU
namespace avx2 {
#define MK_TILE_W 8
#include "backend/cpu/float_tile.inc"
}  // namespace avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
#define MK_TILE_W 16
#include "backend/cpu/float_tile.inc"
}  // namespace avx512
#pragma GCC pop_options
#endif

// Tiles of up to 4 x 4 (the edge tiles of a shape smaller than the ISA's block included): [rows-1][cols-1].
template <template <int, int> class T>
constexpr TileFn kTiles[4][4] = {
    {T<1, 1>::run, T<1, 2>::run, T<1, 3>::run, T<1, 4>::run},
    {T<2, 1>::run, T<2, 2>::run, T<2, 3>::run, T<2, 4>::run},
    {T<3, 1>::run, T<3, 2>::run, T<3, 3>::run, T<3, 4>::run},
    {T<4, 1>::run, T<4, 2>::run, T<4, 3>::run, T<4, 4>::run},
};

struct TileSet {
  const TileFn (*fn)[4];
  int rows, cols;  // the block: as many accumulators as the ISA's registers hold with room to load
};

TileSet tiles(FloatIsa isa) {
  switch (isa) {
#if MK_FLOAT_ISA_TILES
    case FloatIsa::avx512: return {kTiles<avx512::Tile>, 4, 4};  // 16 zmm accumulators of 32
    // 12 ymm accumulators (two per 16 lanes) of 16; 2 x 3 ran 1.25x 2 x 2 in BM_FloatGemm avx2_rows16
    // (Zen 5 VM, 2026-12-02: 80 vs 64 GFLOP/s; 3 x 2 and 1 x 6 slower). AVX-512: 4 x 6, 6 x 4 and 5 x 5
    // measured the same as 4 x 4 there.
    case FloatIsa::avx2: return {kTiles<avx2::Tile>, 2, 3};
#endif
    default: return {kTiles<portable::Tile>, 2, 2};  // 16 xmm accumulators (four per 16 lanes)
  }
}

}  // namespace

const char* float_isa_name(FloatIsa isa) {
  switch (isa) {
    case FloatIsa::portable: return "portable";
    case FloatIsa::avx2: return "avx2";
    case FloatIsa::avx512: return "avx512";
  }
  return "?";
}

bool float_isa_runs(FloatIsa isa) {
#if MK_FLOAT_ISA_TILES
  if (isa == FloatIsa::avx512) return __builtin_cpu_supports("avx512f");
  if (isa == FloatIsa::avx2) return __builtin_cpu_supports("avx2");
#else
  if (isa != FloatIsa::portable) return false;
#endif
  return true;
}

FloatIsa float_isa() {
  static const FloatIsa best = float_isa_runs(FloatIsa::avx512) ? FloatIsa::avx512
                               : float_isa_runs(FloatIsa::avx2) ? FloatIsa::avx2
                                                                : FloatIsa::portable;
  return best;
}

void gemm_f32(const float* x, int64_t ldx, int64_t R, const float* const* w, int64_t C, int64_t K, float* out,
              int64_t ldo, FloatIsa isa) {
  MK_CHECK(float_isa_runs(isa));
  const TileSet t = tiles(isa);
  // Weight rows outermost: a block of t.cols weight rows (t.cols * K floats) stays in L1 while every
  // activation row passes over it, so the weights are read from memory once per call. Meanwhile the
  // row blocks prefetch the next block's weight rows, shared out between them.
  const int64_t n_row_blocks = (R + t.rows - 1) / t.rows;
  for (int64_t j = 0; j < C; j += t.cols) {
    const int cb = static_cast<int>(std::min<int64_t>(t.cols, C - j));
    const int64_t next = std::min<int64_t>(t.cols, std::max<int64_t>(0, C - j - t.cols));  // rows of the next block
    const int64_t per_block = (next + n_row_blocks - 1) / n_row_blocks;
    for (int64_t r = 0, b = 0; r < R; r += t.rows, ++b) {
      const int rb = static_cast<int>(std::min<int64_t>(t.rows, R - r));
      const int64_t p0 = std::min(next, b * per_block), p1 = std::min(next, p0 + per_block);
      t.fn[rb - 1][cb - 1](x + r * ldx, ldx, w + j, K, out + r * ldo + j, ldo, p1 > p0 ? w + j + t.cols + p0 : w,
                           static_cast<int>(p1 - p0));
    }
  }
}

}  // namespace mk::cpu
