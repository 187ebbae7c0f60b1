// Numerics shared by every backend, so the reference, the CPU interpreter and generated CUDA agree
// on constants: RoPE inverse frequencies (incl. llama3 scaling), GELU forms and soft-capping.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "ir/graph.h"

namespace mk {

// Inverse frequency for each rotated pair i in [0, n_rot/2): theta^(-2i/n_rot), then llama3
// frequency scaling when the rope node carries {scaling="llama3", factor, low_freq_factor,
// high_freq_factor, original_max_pos} (Meta's Llama 3.1 reference code), or linear scaling
// {scaling="linear", factor}; then divided per pair by {freq_factors="f0,f1,..."} (llama.cpp's
// rope_freqs.weight, n_rot/2 positive factors) when present; last, rounded to bfloat16 when {freq_dtype="bf16"} (what
// transformers computes after casting a model's buffers to bf16).
std::vector<double> rope_inv_freq(const Node& rope);

inline float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
inline float gelu_tanh_approx(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// Logit soft-capping (Gemma 2; llama.cpp: ggml_scale by 1/cap, ggml_tanh, ggml_scale by cap, in float).
inline float softcap(float x, float cap) { return cap * std::tanh(x * (1.0f / cap)); }

// Mixture of experts: the most experts a moe_route row selects (Qwen3-MoE 8, Mixtral 2, OLMoE 8;
// the CUDA template keeps a row's selection in registers).
constexpr int64_t kMoeMaxUsed = 32;

// One row of moe_route (ir/ops.def), llama.cpp's softmax gating (ggml_soft_max: e_i = expf(x_i - max),
// sum in double, p_i = e_i * (float)(1 / sum); ggml_top_k; ggml_div by the sum (double, rounded to float) of the k
// probabilities when norm): out[0, k) = the k experts of highest probability as floats, descending,
// ties to the lower index (a NaN probability never wins); out[k, 2k) = their probabilities (each
// divided by that sum when norm). e: n_expert floats of scratch.
inline void moe_route_row(const float* logits, int64_t n_expert, int64_t k, bool norm, float* e, float* out) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n_expert; ++i) mx = std::fmax(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n_expert; ++i) {
    e[i] = std::exp(logits[i] - mx);
    sum += e[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n_expert; ++i) e[i] *= inv;
  double wsum = 0;  // ggml_sum_rows: a double sum
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t i = 0; i < n_expert; ++i) {
      bool taken = false;
      for (int64_t t = 0; t < j; ++t) taken = taken || static_cast<int64_t>(out[t]) == i;
      if (!taken && (best < 0 || e[i] > e[best] || (std::isnan(e[best]) && !std::isnan(e[i])))) best = i;
    }
    out[j] = static_cast<float>(best);
    out[k + j] = e[best];
    wsum += e[best];
  }
  if (norm)
    for (int64_t j = 0; j < k; ++j) out[k + j] /= static_cast<float>(wsum);
}

}  // namespace mk
