#include "model/hparams.h"

#include <array>
#include <utility>

#include "support/error.h"

namespace mk {

namespace {
// Bounds: 4x-1000x the largest released models, small enough that the products in hparams.h fit
// 64 bits: n_ctx * n_head_kv * head_dim * n_layer * 4 <= 2^22 * 2^10 * 2^12 * 2^10 * 2^2 = 2^56.
constexpr std::array<std::pair<std::string_view, HparamRange>, 12> kRanges = {{
    {"n_vocab", {1, int64_t{1} << 22}},
    {"n_embd", {1, int64_t{1} << 16}},
    {"n_ff", {1, int64_t{1} << 18}},
    {"n_layer", {1, int64_t{1} << 10}},
    {"n_head", {1, int64_t{1} << 10}},
    {"n_head_kv", {1, int64_t{1} << 10}},
    {"head_dim", {1, int64_t{1} << 12}},
    {"n_ctx", {1, int64_t{1} << 22}},
    {"n_rot", {0, int64_t{1} << 12}},
    {"sliding_window", {0, int64_t{1} << 30}},
    {"n_expert", {0, int64_t{1} << 10}},
    {"n_expert_used", {1, 32}},  // ir/ops.h kMoeMaxUsed
}};
}  // namespace

HparamRange hparam_range(std::string_view term) {
  for (const auto& [name, r] : kRanges)
    if (name == term) return r;
  MK_CHECK(false, "unknown hyperparameter term {}", term);
  return {};
}

int64_t checked_hparam(std::string_view term, int64_t value, std::string_view where) {
  const HparamRange r = hparam_range(term);
  if (value >= r.min && value <= r.max) return value;
  if (r.min == r.max) fail("{} = {}: only {} is supported ({})", where, value, r.min, term);
  if (value < r.min) {
    if (r.min == 1) fail("{} = {} must be positive ({})", where, value, term);
    fail("{} = {} must be at least {} ({})", where, value, r.min, term);
  }
  fail("{} = {} exceeds the limit {} ({})", where, value, r.max, term);
}

int64_t checked_mul(int64_t a, int64_t b, std::string_view where) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) fail("{}: {} x {} overflows", where, a, b);
  return r;
}

}  // namespace mk
