// 8-bit activation blocks (quant.h ActQuant): q8_0 and q8_1 as ggml's x86 quantize_row_q8_0 /
// quantize_row_q8_1 (arch/x86/quants.c, AVX2 path) compute them.
#include <algorithm>
#include <cmath>

#include "quant/quant_impl.h"

namespace mk::quant {
namespace {
using namespace detail;

// One 32-element block: d = amax / 127 (f16), q = nearest-even(x * (127 / amax)); with S, also
// s = d * sum(q) (f16, d before its rounding to f16).
template <bool S>
void quantize_q8(const float* x, void* dst, int64_t n) {
  constexpr int kBytes = S ? 36 : 34, kQs = S ? 4 : 2;
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32, b += kBytes) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
    st_f16(b, d);
    int32_t sum = 0;
    int8_t* q = reinterpret_cast<int8_t*>(b + kQs);
    for (int j = 0; j < 32; ++j) {
      const int v = static_cast<int>(std::nearbyint(x[j] * id));  // default rounding: to nearest even
      q[j] = static_cast<int8_t>(v);
      sum += v;
    }
    if constexpr (S) st_f16(b + 2, d * static_cast<float>(sum));
  }
}

}  // namespace

extern const ActQuant kQ8_0Act = {"q8_0", 32, 34, quantize_q8<false>};
extern const ActQuant kQ8_1Act = {"q8_1", 32, 36, quantize_q8<true>};

const ActQuant& act_q8_0() { return kQ8_0Act; }
const ActQuant& act_q8_1() { return kQ8_1Act; }
}  // namespace mk::quant
