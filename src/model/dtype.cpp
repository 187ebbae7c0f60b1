#include "model/dtype.h"

#include <cmath>

#include "quant/quant.h"
#include "support/error.h"

namespace mk {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    default: break;
  }
  if (const quant::QuantType* q = quant::quant_type(t)) return q->name;
  return "?";
}

bool dtype_is_quantized(DType t) { return quant::quant_type(t) != nullptr; }

int64_t dtype_block_size(DType t) {
  const quant::QuantType* q = quant::quant_type(t);
  return q ? q->block_size : 1;
}
int64_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    default: break;
  }
  const quant::QuantType* q = quant::quant_type(t);
  return q ? q->block_bytes : 0;
}

size_t dtype_bytes(DType t, int64_t n) {
  int64_t bs = dtype_block_size(t);
  if (n < 0 || n % bs != 0) fail("{} elements is not a whole number of {} blocks of {}", n, dtype_name(t), bs);
  return static_cast<size_t>(n / bs) * static_cast<size_t>(dtype_block_bytes(t));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00);
  if (absx >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf (round-aware)
  if (absx < 0x38800000) {  // subnormal or zero
    float a;
    std::memcpy(&a, &absx, 4);
    uint32_t m = static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t e = ((absx >> 23) - 112) << 10;
  uint32_t m = (absx >> 13) & 0x3ff;
  uint32_t rest = absx & 0x1fff;
  uint32_t h = e | m;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return static_cast<uint16_t>(sign | h);
}

void to_f32(DType t, const void* src, float* dst, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::F32: std::memcpy(dst, p, static_cast<size_t>(n) * 4); return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    case DType::I32:
      for (int64_t i = 0; i < n; ++i) {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        dst[i] = static_cast<float>(v);
      }
      return;
    default: break;
  }
  const quant::QuantType* q = quant::quant_type(t);
  MK_CHECK(q && n % q->block_size == 0);
  q->dequantize_row(src, dst, n);
}

}  // namespace mk
