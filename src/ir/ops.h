// Numerics shared by every backend, so the reference, the CPU interpreter and generated CUDA agree
// on constants: RoPE inverse frequencies (incl. llama3 scaling), GELU forms and soft-capping.
#pragma once
#include <cmath>
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

}  // namespace mk
