// Element types of weight tensors, and conversions to float32.
// The quantized types (Q*) are ggml's block types: their layouts, dequantization and dot products
// are one table entry each in src/quant/ (quant/quant.h cites the ggml/GGUF type table).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace mk {

// I32 is used for token ids and positions in the IR, never for weights.
enum class DType : uint8_t { F32, F16, BF16, Q8_0, I32, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS };
// Every DType, for parsers and tests.
inline constexpr DType kAllDTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::I32,
                                       DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K,
                                       DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL,
                                       DType::IQ4_XS};
// True for the ggml block types (Q4_0 ... Q6_K, IQ4_NL, IQ4_XS).
bool dtype_is_quantized(DType t);

std::string_view dtype_name(DType t);
// Elements per block (1 for plain types, 32 or 256 for the quantized ones) and bytes per block.
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
// IEEE half -> float, exact for every input; NaNs keep sign and payload, signalling ones are
// quieted (quiet bit set), as x86's vcvtph2ps does. Scalar, portable: for rows use f16_to_f32_row.
float f16_to_f32(uint16_t h);
// n halves at src (any alignment, little-endian) -> dst: F16C / AVX-512 conversions picked once at
// run time, else (or with portable = true) the f16_to_f32 loop; the bits are the same either way.
void f16_to_f32_row(const void* src, float* dst, int64_t n, bool portable = false);
// The conversion f16_to_f32_row uses on this CPU: "avx512", "f16c" or "portable".
const char* f16_row_isa();
uint16_t f32_to_f16(float f);

// Converts n elements starting at element 0 of `src` (a whole number of blocks for quantized types)
// to float32.
void to_f32(DType t, const void* src, float* dst, int64_t n);

}  // namespace mk
