// q4_0 (ggml id 2): 32 elements in 18 bytes, { f16 d; u8 qs[16] }; element j < 16 is the low
// nibble of qs[j], element j + 16 its high nibble; value d * (q - 8) (ggml-common.h block_q4_0).
#include <algorithm>

#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;
constexpr int kQK = 32, kBytes = 18;

inline void dequant_block(const uint8_t* b, float* y) {
  const float d = ld_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// ggml quantize_row_q4_0_ref: d = (value of largest magnitude) / -8.
void quantize_row(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i, x += kQK, b += kBytes) {
    float amax = 0, max = 0;
    for (int j = 0; j < kQK; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -8, id = d != 0 ? 1.0f / d : 0.0f;
    st_f16(b, d);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      b[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

int64_t find_bad_scale(const void* src, int64_t nb) { return first_bad_f16(src, nb, kBytes, {0}); }

MK_QUANT_DOT(dot, kQK, kBytes, dequant_block)
}  // namespace

extern const QuantType kQ4_0 = {DType::Q4_0, "q4_0", 2, kQK, kBytes, dequantize_blocks<kQK, kBytes, dequant_block>,
                                quantize_row, dot, {dot_generic, dot_avx2, dot_avx512}, find_bad_scale};
}  // namespace mk::quant
