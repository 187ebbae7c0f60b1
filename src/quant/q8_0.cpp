// q8_0 (ggml id 8): 32 elements in 34 bytes, { f16 d; i8 qs[32] }; value d * q (block_q8_0).
#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 32, kBytes = 34;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// ggml quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d).
void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    const float d = amax(x, kQK) / 127, id = d != 0 ? 1.0f / d : 0.0f;
    st_f16(b, d);
    for (int j = 0; j < kQK; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0}); }

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)
}  // namespace

extern const QuantType kQ8_0 = {DType::Q8_0, "q8_0", 8, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale};
}  // namespace mk::quant
