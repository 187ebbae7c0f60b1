// Shared pieces of the Hugging Face family descriptions (hf_llama.cpp, qwen2.cpp, qwen3.cpp,
// gemma.cpp, phi3.cpp, gpt2.cpp): hyperparameters from config.json and a DecoderSpec for the
// transformers Llama layout (model.embed_tokens, model.layers.N.self_attn.q_proj, ...).
#pragma once
#include <nlohmann/json.hpp>

#include "archs/blocks.h"

namespace mk {

// config.json of an HF model (metadata `hf.config`); throws mk::Error when absent.
const nlohmann::ordered_json& hf_config(const ModelFile& m);

// A boolean config field: its value, `def` when absent or null; anything else is refused by name.
bool config_bool(const nlohmann::ordered_json& c, const char* key, bool def);

// Hyperparameters from config.json, accepting both the Llama spelling (hidden_size,
// num_hidden_layers, ...) and GPT-2's (n_embd, n_layer, n_head, n_positions, n_inner).
// head_dim defaults to n_embd / n_head; num_key_value_heads to n_head; n_ctx_train is
// max_position_embeddings (a sliding window does not limit it: hf_llama_spec windows the layers).
Hparams read_hf_hparams(const ModelFile& m);

// The canonical (GGUF) name -> transformers Llama-layout name; "" for tensors this layout lacks.
// `tied`: the classifier is the token embedding, so output.weight resolves to "".
std::string hf_llama_tensor_name(const std::string& canonical, bool tied);

// A DecoderSpec for Llama-layout checkpoints: RMSNorm, SiLU-gated FFN, RoPE on halves of each head
// (transformers' rotate_half) with read_hf_rope's theta/scaling/partial rotary factor, the
// classifier tied or lm_head per tie_word_embeddings (absent: `tied_default`, the family's
// transformers default; a tie_word_embeddings that is not a boolean is refused). Throws when
// lm_head.weight is required but missing. Sliding-window attention as transformers' Mistral, Phi-3,
// Qwen2 and Qwen3 configs ask (sliding_window on every layer; Qwen: with use_sliding_window, from
// max_window_layers on; or per layer_types), with the one RoPE.
// `windowed`: the family sets its windows itself (Gemma 2 / 3). `rope_config`: read RoPE settings from this object instead of
// config.json (a per-layer-type part of `rope_parameters`); null = config.json.
DecoderSpec hf_llama_spec(const ModelFile& m, const BuildOptions& o, bool tied_default, bool windowed = false,
                          const nlohmann::ordered_json* rope_config = nullptr);

// transformers computes a checkpoint in its config dtype (`dtype`, older `torch_dtype`): for
// bfloat16, the model's non-persistent buffers — RoPE's inv_freq, Gemma's sqrt(hidden_size)
// normalizer — are bf16-rounded too. The families reproduce that so logits match transformers
// (about 1e-3 relative otherwise); the weights themselves are exact either way.
bool hf_bf16_buffers(const nlohmann::ordered_json& config);

// Mixture of experts (DecoderSpec::n_expert ..) from a Qwen3-MoE (`num_experts`,
// `num_experts_per_tok`, `moe_intermediate_size`, `norm_topk_prob` default false; every layer
// sparse: `decoder_sparse_step` 1 and no `mlp_only_layers`, others refused), OLMoE (`num_experts`,
// `num_experts_per_tok`, experts of `intermediate_size`, `norm_topk_prob` default false) or Mixtral
// config (`num_local_experts`, `num_experts_per_tok`, experts of `intermediate_size`, weights
// normalised). Mixtral's tensor names replace Qwen's in s.resolve.
enum class HfMoe { qwen3, olmoe, mixtral };
void hf_moe(const ModelFile& m, DecoderSpec& s, HfMoe kind);

// Activation of `hidden_activation` (if set) else `hidden_act`: silu | gelu | gelu_tanh.
std::string hf_activation(const nlohmann::ordered_json& config);

}  // namespace mk
