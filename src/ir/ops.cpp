#include "ir/ops.h"

#include <numbers>

#include "support/error.h"

namespace mk {

std::vector<double> rope_inv_freq(const Node& n) {
  int64_t hd = n.attr_int("head_dim");
  int64_t n_rot = n.attr_int("n_rot", hd);
  double theta = n.attr_float("theta");
  std::vector<double> f(static_cast<size_t>(n_rot / 2));
  for (int64_t i = 0; i < n_rot / 2; ++i) f[static_cast<size_t>(i)] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
  std::string scaling = n.attr_str("scaling", "none");
  if (scaling == "none") return f;
  if (scaling == "linear") {
    double factor = n.attr_float("factor");
    for (auto& x : f) x /= factor;
    return f;
  }
  if (scaling == "llama3") {
    double factor = n.attr_float("factor"), lo = n.attr_float("low_freq_factor"),
           hi = n.attr_float("high_freq_factor"), orig = n.attr_float("original_max_pos");
    double low_wavelen = orig / lo, high_wavelen = orig / hi;
    for (auto& x : f) {
      double wavelen = 2 * std::numbers::pi / x;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        x /= factor;
      } else {
        double smooth = (orig / wavelen - lo) / (hi - lo);
        x = (1 - smooth) * x / factor + smooth * x;
      }
    }
    return f;
  }
  fail("rope: unknown scaling '{}'", scaling);
}

}  // namespace mk
