// Token sampling from a logits row: greedy (temperature 0), or temperature + top-k + top-p
// (nucleus, Holtzman et al. 2019) with a seeded generator, so a seed reproduces a run exactly.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>

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
  // Throws mk::Error when a logit is NaN or infinite (see check_finite_logits): such a row has no
  // meaningful distribution, and which token "wins" would depend on where the bad value sits.
  int32_t sample(std::span<const float> logits);

 private:
  SamplerOptions o_;
  std::mt19937_64 rng_;
};

// Index of the largest value; ties go to the lowest index. NaN values never win, wherever they sit;
// -1 when every value is NaN. (Diagnostics only: generation refuses non-finite rows first.)
int32_t argmax(std::span<const float> v);

// Throws mk::Error "logits are not finite at <where>: token 7 is nan (3 of 512 values are not
// finite)" when any value is NaN or +-inf. `where` names the step and position for the user.
void check_finite_logits(std::span<const float> logits, const std::string& where);

}  // namespace mk
