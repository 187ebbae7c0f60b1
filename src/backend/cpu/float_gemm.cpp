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

// 16 float lanes as one value (GCC/Clang vector extension): one zmm register where the function is
// compiled for AVX-512F, two ymm for AVX2, four xmm for SSE2. Lane l of a 16-element piece at i
// holds element i + l, so the lanes are dot()'s lanes (i mod 16).
typedef float V16 __attribute__((vector_size(64)));
typedef float V16u __attribute__((vector_size(64), aligned(4), may_alias));  // an unaligned load

typedef float V8 __attribute__((vector_size(32)));
typedef float V4 __attribute__((vector_size(16)));

// dot()'s tree on the 16 lanes in registers: lane l += lane l + 8, then l + 4, l + 2, l + 1 (the
// same adds, so the same bits, without going through memory).
[[gnu::always_inline]] inline float tree16(V16 a) {
  const V8 t = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  const V4 u = __builtin_shufflevector(t, t, 0, 1, 2, 3) + __builtin_shufflevector(t, t, 4, 5, 6, 7);
  return (u[0] + u[2]) + (u[1] + u[3]);
}

// RB activation rows x CB weight rows: RB * CB accumulators, each weight and activation piece
// loaded once per 16 elements, then the K % 16 tail (scalar, on the stored lanes) and the tree as in
// dot(). Inlined into each ISA's wrapper below, which decides the registers.
template <int RB, int CB>
[[gnu::always_inline]] inline void tile_body(const float* __restrict x, int64_t ldx, const float* const* w, int64_t K,
                                             float* out, int64_t ldo) {
  V16 acc[RB][CB];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c) acc[r][c] = V16{};
  const float* wp[CB];
#pragma GCC unroll 8
  for (int c = 0; c < CB; ++c) wp[c] = w[c];
  const int64_t k16 = K / kLanes * kLanes;
  for (int64_t i = 0; i < k16; i += kLanes) {
    V16 wv[CB];
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c) wv[c] = *reinterpret_cast<const V16u*>(wp[c] + i);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const V16 xv = *reinterpret_cast<const V16u*>(x + r * ldx + i);
#pragma GCC unroll 8
      for (int c = 0; c < CB; ++c) acc[r][c] += xv * wv[c];
    }
  }
  if (k16 < K)  // the tail: element i into lane i - k16 (= i mod 16), as dot() does
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < CB; ++c) {
        float a[kLanes];
        std::memcpy(a, &acc[r][c], sizeof a);
        const float* xr = x + r * ldx;
        for (int64_t i = k16, l = 0; i < K; ++i, ++l) a[l] += xr[i] * wp[c][i];
        std::memcpy(&acc[r][c], a, sizeof a);
      }
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c) out[r * ldo + c] = tree16(acc[r][c]);
}

using TileFn = void (*)(const float*, int64_t, const float* const*, int64_t, float*, int64_t);

#define MK_FLOAT_TILE(NAME, ATTR)                                                                                  \
  template <int RB, int CB>                                                                                        \
  struct NAME {                                                                                                    \
    ATTR static void run(const float* x, int64_t ldx, const float* const* w, int64_t K, float* out, int64_t ldo) { \
      tile_body<RB, CB>(x, ldx, w, K, out, ldo);                                                                   \
    }                                                                                                              \
  };
MK_FLOAT_TILE(TilePortable, )
#if defined(__x86_64__)
MK_FLOAT_TILE(TileAvx2, __attribute__((target("avx2"))))
MK_FLOAT_TILE(TileAvx512, __attribute__((target("avx512f"))))
#endif
#undef MK_FLOAT_TILE

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
#if defined(__x86_64__)
    case FloatIsa::avx512: return {kTiles<TileAvx512>, 4, 4};  // 16 zmm accumulators of 32
    case FloatIsa::avx2: return {kTiles<TileAvx2>, 2, 2};      // 8 ymm accumulators of 16
#endif
    default: return {kTiles<TilePortable>, 2, 2};
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
#if defined(__x86_64__)
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
  // activation row passes over it, so the weights are read from memory once per call.
  for (int64_t j = 0; j < C; j += t.cols) {
    const int cb = static_cast<int>(std::min<int64_t>(t.cols, C - j));
    for (int64_t r = 0; r < R; r += t.rows) {
      const int rb = static_cast<int>(std::min<int64_t>(t.rows, R - r));
      t.fn[rb - 1][cb - 1](x + r * ldx, ldx, w + j, K, out + r * ldo + j, ldo);
    }
  }
}

}  // namespace mk::cpu
