// Element types of weight tensors, and conversions to float32.
// Q8_0 follows ggml: blocks of 32 int8 values with one f16 scale (34 bytes per block).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace mk {

// I32 is used for token ids and positions in the IR, never for weights.
enum class DType : uint8_t { F32, F16, BF16, Q8_0, I32 };

std::string_view dtype_name(DType t);
// Elements per block (1 for plain types, 32 for Q8_0) and bytes per block.
int64_t dtype_block_size(DType t);
int64_t dtype_block_bytes(DType t);
// Bytes for n elements; throws mk::Error when n is not a whole number of blocks.
size_t dtype_bytes(DType t, int64_t n_elements);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements starting at element 0 of `src` (a whole number of blocks for Q8_0) to float32.
void to_f32(DType t, const void* src, float* dst, int64_t n);

}  // namespace mk
