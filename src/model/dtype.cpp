#include "model/dtype.h"

#include <cmath>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

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

// Integer-only, so the result does not depend on the FPU's NaN handling: normal numbers rebias
// the exponent, subnormals are normalised, NaNs keep sign and payload with the quiet bit set.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {             // subnormal: mant * 2^-24; shift the leading one into the implicit bit
    uint32_t e = 113;  // float exponent field of 2^-14, the half subnormals' scale
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace {

void f16_row_portable(const uint8_t* p, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    dst[i] = f16_to_f32(h);
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MK_F16_X86 1
// vcvtph2ps: exact like f16_to_f32, and like it quiets signalling NaNs keeping sign and payload;
// test_quant.cpp checks all 65536 inputs against f16_to_f32.
__attribute__((target("avx,f16c"))) void f16_row_f16c(const uint8_t* p, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i))));
  f16_row_portable(p + 2 * i, dst + i, n - i);
}
__attribute__((target("avx512f,avx,f16c"))) void f16_row_avx512(const uint8_t* p, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i,  // maskz: GCC 12 warns about _mm512_cvtph_ps's undefined source
                     _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2 * i))));
  f16_row_f16c(p + 2 * i, dst + i, n - i);
}
#else
#define MK_F16_X86 0
#endif

using F16RowFn = void (*)(const uint8_t*, float*, int64_t);
struct F16Row {
  F16RowFn fn;
  const char* name;
};

F16Row pick_f16_row() {
#if MK_F16_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {f16_row_avx512, "avx512"};
  if (__builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c")) return {f16_row_f16c, "f16c"};
#endif
  return {f16_row_portable, "portable"};
}

const F16Row& f16_row() {
  static const F16Row r = pick_f16_row();
  return r;
}

}  // namespace

void f16_to_f32_row(const void* src, float* dst, int64_t n, bool portable) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  if (portable) f16_row_portable(p, dst, n);
  else f16_row().fn(p, dst, n);
}

const char* f16_row_isa() { return f16_row().name; }

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
    case DType::F16: f16_to_f32_row(p, dst, n); return;
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
