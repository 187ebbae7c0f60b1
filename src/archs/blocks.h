// Shared building blocks for decoder-only transformers. Family files (llama.cpp, gpt2.cpp, ...)
// fill a DecoderSpec from their hyperparameters and weight names, then call build_decoder().
//
// Weight names are canonical GGUF names ("blk.3.attn_q.weight"); a family whose file uses other
// names supplies `resolve` to map a canonical name to the file's name ("" = absent).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "archs/arch.h"

namespace mk {

struct DecoderSpec {
  Hparams hp;
  int64_t n_ctx = 0;  // positions per sequence
  bool all_logits = false;
  bool embeddings = false;  // BuildOptions::embeddings
  int64_t kv_pool_tokens = 0, kv_block_size = 0;  // paged KV pool (BuildOptions)

  enum class Norm { rms, layer } norm = Norm::rms;
  double norm_weight_offset = 0.0;  // Gemma stores w and scales by (1 + w)
  bool embed_scale = false;         // Gemma: embeddings * sqrt(n_embd)
  double embed_scale_value = 0.0;   // the factor when not exactly sqrt(n_embd) (bf16-rounded in HF bf16 models)
  bool learned_positions = false;   // GPT-2: + pos_embd[position]

  std::string rope_mode = "adjacent";  // "adjacent" (GGUF/llama2.c) or "halves" (HF rotate_half)
  double rope_theta = 10000.0;
  int64_t n_rot = 0;  // rotated dims per head; 0 = head_dim; negative = no RoPE
  double rope_attn_factor = 1.0;  // scales the rotated q/k values (llama.cpp attn_factor, LongRoPE attention_factor)
  Attrs rope_scaling;  // e.g. {scaling="llama3", factor, low_freq_factor, high_freq_factor, original_max_pos}

  // Sliding-window attention (Gemma 3): layers with swa_layers[il] attend only to the last
  // `sliding_window` positions (the attention op's `window`) and rotate with rope_theta_swa and
  // rope_scaling_swa; the other layers are global (rope_theta, rope_scaling). Empty = all global.
  int64_t sliding_window = 0;
  std::vector<bool> swa_layers;
  double rope_theta_swa = 10000.0;
  Attrs rope_scaling_swa;
  // Gemma 2/3: RMSNorm of the attention and FFN outputs (post_attention_norm, post_ffw_norm) before
  // each residual add.
  bool post_norms = false;
  // Gemma 2: logit soft-capping, x -> cap * tanh(x / cap), of every attention score (after the
  // scale, before the softmax) and of the output logits; 0 = none.
  double attn_softcap = 0.0, final_softcap = 0.0;

  // Phi-2: attention and FFN both read the layer's one norm (attn_norm) and add to the residual
  // together: x + (attn(norm(x)) + ffn(norm(x))); no ffn_norm.
  bool parallel_residual = false;
  bool output_bias = false;  // Phi-2: the classifier has a bias (output.bias, required)
  // Granite: the attention and FFN outputs are multiplied by residual_scale before each residual add,
  // and the logits divided by logit_scale; 1 = none.
  double residual_scale = 1.0, logit_scale = 1.0;
  // SmolLM3: layers whose attention takes no RoPE (nope_layers[il] true; "NoPE"); empty = none.
  std::vector<bool> nope_layers;

  // Mixture of experts (llama.cpp build_moe_ffn with softmax gating; Mixtral, Qwen3-MoE): n_expert > 0
  // replaces each layer's FFN: the router ffn_gate_inp [n_expert, n_embd] picks the n_expert_used
  // experts of highest softmax probability per row, each a gated FFN of ffn_gate_exps / ffn_up_exps
  // [n_expert, n_ff_exp, n_embd] and ffn_down_exps [n_expert, n_embd, n_ff_exp], their outputs added
  // weighted by the probabilities (moe_norm: divided by the selected ones' sum first).
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
  bool moe_norm = true;

  bool qk_norm = false;                // Qwen3: RMSNorm over each head of q and k
  bool qk_norm_full = false;           // OLMo 2: ... over the whole q and k projections instead
  bool pre_norms = true;               // OLMo 2: false: no attn_norm / ffn_norm (post_norms alone)
  std::string ffn_act = "silu";        // silu | gelu | gelu_tanh
  bool ffn_gated = true;               // act(gate(x)) * up(x), else act(up(x))
  double attn_scale = 0.0;             // 0 = 1/sqrt(head_dim)

  std::function<std::string(const std::string&)> resolve;  // canonical -> file name ("" = absent)
};

// The rope op's {freq_factors} attribute (ir/ops.h) for per-pair factors: "f0,f1,..." (round-trip precision).
std::string rope_freq_factors(const std::vector<double>& factors);

// Builds the graph; required weights are looked up and shape-checked against hp, optional ones
// (biases, q/k norms, a separate classifier) are used when present. Output "logits":
// [n_tokens, n_vocab] when all_logits, else [n_out, n_vocab] (the rows a step asks for: the last one
// for one sequence); with embeddings, output "embd" [n_tokens, n_embd] instead.
Graph build_decoder(const ModelFile& model, const DecoderSpec& spec);

}  // namespace mk
