#include "ir/ops.h"

#include <cmath>
#include <cstdlib>
#include <numbers>

#include "model/dtype.h"
#include "support/error.h"

namespace mk {

namespace {

// Frequencies before the optional rounding (see rope_inv_freq).
std::vector<double> scaled_inv_freq(const Node& n) {
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

// {freq_factors="f0,f1,..."}: one factor per rotated pair, each frequency divided by its factor
// (llama.cpp's rope_freqs.weight / ggml_rope_ext freq_factors).
void apply_freq_factors(const Node& n, std::vector<double>& f) {
  if (!n.attrs.count("freq_factors")) return;
  const std::string list = n.attr_str("freq_factors");
  size_t i = 0, at = 0;
  while (at <= list.size()) {
    size_t end = list.find(',', at);
    if (end == std::string::npos) end = list.size();
    const std::string tok = list.substr(at, end - at);
    char* stop = nullptr;
    const double v = std::strtod(tok.c_str(), &stop);
    if (tok.empty() || stop != tok.c_str() + tok.size() || !(v > 0) || !std::isfinite(v))
      fail("rope: freq_factors entry {} '{}' is not a positive number", i, tok);
    if (i >= f.size()) fail("rope: more freq_factors than the {} rotated pairs", f.size());
    f[i++] /= v;
    at = end + 1;
  }
  if (i != f.size()) fail("rope: {} freq_factors for {} rotated pairs", i, f.size());
}

}  // namespace

std::vector<double> rope_inv_freq(const Node& n) {
  std::vector<double> f = scaled_inv_freq(n);
  apply_freq_factors(n, f);
  // freq_dtype=bf16 rounds each frequency to bfloat16: what transformers computes once a model's
  // buffers (its inv_freq) have been cast to bf16. Off by default; tests use it to reproduce such
  // references exactly.
  const std::string freq_dtype = n.attr_str("freq_dtype", "f32");
  if (freq_dtype == "bf16") {
    for (auto& x : f) x = bf16_to_f32(f32_to_bf16(static_cast<float>(x)));
  } else if (freq_dtype != "f32") {
    fail("rope: unknown freq_dtype '{}'", freq_dtype);
  }
  return f;
}

}  // namespace mk

#include "ir/fused.h"

namespace mk {

FusedMatmulLayout fused_matmul_layout(const Node& n) {
  FusedMatmulLayout L;
  L.pro = n.attr_str("pro", "none");
  L.glu = n.attr_str("glu", "none");
  L.epi = n.attr_str("epi", "none");
  if (L.pro != "none" && L.pro != "rms_norm") fail("%{} fused_matmul: unknown pro '{}'", n.id, L.pro);
  if (L.glu != "none" && L.glu != "silu" && L.glu != "gelu" && L.glu != "gelu_tanh")
    fail("%{} fused_matmul: unknown glu '{}'", n.id, L.glu);
  if (L.epi != "none" && L.epi != "add" && L.epi != "rope" && L.epi != "store" && L.epi != "rope_store")
    fail("%{} fused_matmul: unknown epi '{}'", n.id, L.epi);
  int next = 2;
  if (L.glu != "none") L.w_up = next++;
  if (L.pro == "rms_norm") L.norm_w = next++;
  if (L.epi == "add") L.residual = next++;
  if (L.has_rope()) L.positions = next++;
  if (L.has_store()) L.cache = next++;
  L.n_inputs = next;
  return L;
}

}  // namespace mk
