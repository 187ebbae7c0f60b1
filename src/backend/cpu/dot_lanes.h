// dot_f32's arithmetic (float_gemm.h), for inlining into the float kernels. Include it only from
// sources built with -ffp-contract=off (CMakeLists.txt): anywhere else the compiler may fuse the
// multiply and the add and change the bits. Internal linkage, so no other source's copy is shared.
#pragma once
#include <cstdint>

namespace mk::cpu {
namespace {

constexpr int kLanes = 16;

// Sum of a[i] * b[i] in 16 lanes (lane = i mod 16), combined in a fixed tree.
inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  for (int s = kLanes / 2; s > 0; s /= 2)
    for (int l = 0; l < s; ++l) acc[l] += acc[l + s];
  return acc[0];
}

}  // namespace
}  // namespace mk::cpu
