// The `topk` op's sizes (ir/ops.def): k of the graphs the architectures build (graph output
// "topk"; sampling with top_k in [1, kTopK] reads these candidates instead of the logits row,
// runtime/sampler.h Sampler::covered_by), and the largest k the op takes.
#pragma once
#include <cstdint>

namespace mk {

constexpr int64_t kTopK = 64;
constexpr int64_t kTopKLimit = 256;

}  // namespace mk
