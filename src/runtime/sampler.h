// Token sampling from a logits row: greedy (temperature 0), or temperature + top-k + top-p
// (nucleus, Holtzman et al. 2019) with a seeded generator, so a seed reproduces a run exactly.
#pragma once
#include <cstdint>
#include <random>
#include <span>

namespace mk {

struct SamplerOptions {
  float temperature = 0.8f;  // 0 = greedy argmax
  int top_k = 40;            // 0 = off
  float top_p = 0.95f;       // 1 = off
  uint64_t seed = 42;
};

class Sampler {
 public:
  explicit Sampler(SamplerOptions o);
  int32_t sample(std::span<const float> logits);

 private:
  SamplerOptions o_;
  std::mt19937_64 rng_;
};

// Index of the largest value; ties go to the lowest index.
int32_t argmax(std::span<const float> v);

}  // namespace mk
