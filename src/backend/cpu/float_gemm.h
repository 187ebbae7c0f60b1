// Float32 dot products and register-blocked many-row matmul tiles of the CPU interpreter.
//
// The contract (why every variant here exists in this shape): the float32 result of one output
// element, activation row x weight row over K elements, is dot_f32's: 16 lanes (element i goes to
// lane i mod 16), each lane a multiply then an add per element in index order (no fused multiply-add;
// the sources are built with -ffp-contract=off), the lanes combined in the fixed tree 8, 4, 2, 1.
// So a row computed in a 16-row batch has the same bits as the row computed alone, whichever tile,
// ISA or worker computed it ("batching changes nothing", issue 11).
#pragma once
#include <cstdint>

namespace mk::cpu {

// Sum of a[i] * b[i], i < n, in dot_f32's 16 lanes and tree (the reference of the contract above).
float dot_f32(const float* a, const float* b, int64_t n);

// Instruction sets of gemm_f32's tiles, chosen at run time (__builtin_cpu_supports), as src/quant does;
// passing one explicitly is for tests and benchmarks. The AVX2 and AVX-512 tiles need GCC on x86-64.
enum class FloatIsa {
  portable,  // 2 x 2 in 4-float registers (SSE2, NEON), any CPU
  avx2,      // 2 activation rows x 3 weight rows per tile, each 16-lane accumulator two 8-lane registers
  avx512,    // 4 activation rows x 4 weight rows per tile, one 16-lane register per accumulator
};
const char* float_isa_name(FloatIsa isa);
bool float_isa_runs(FloatIsa isa);  // whether this CPU executes `isa`
FloatIsa float_isa();               // the fastest this CPU runs (decided once)

// out[r * ldo + j] = dot_f32(x + r * ldx, w[j], K) for r < R, j < C: activation rows x (R of them,
// ldx floats apart) against the weight rows w[0..C) (K floats each). Register-blocked: each tile
// loads every 16-lane piece of its activation and weight rows once for all its R x C accumulators.
// Every element has dot_f32's bits for every R, C, K (tails included) and every `isa` that runs.
void gemm_f32(const float* x, int64_t ldx, int64_t R, const float* const* w, int64_t C, int64_t K, float* out,
              int64_t ldo, FloatIsa isa = float_isa());

}  // namespace mk::cpu
