// Qwen3 (Qwen3ForCausalLM): the Llama layout plus an RMSNorm over each head of q and k (q_norm,
// k_norm, weight [head_dim]) before RoPE; head_dim is set apart from hidden_size / n_head.
// Source: transformers modeling_qwen3.py.
#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"

namespace mk {

Graph build_hf_qwen3(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = hf_llama_spec(m, o, false);  // Qwen3Config defaults tie_word_embeddings to false
  s.qk_norm = true;
  return build_decoder(m, s);
}

// GGUF "qwen3": NEOX RoPE, blk.N.attn_{q,k}_norm.weight ([head_dim]) required; head_dim from
// qwen3.attention.key_length.
Graph build_gguf_qwen3(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  s.qk_norm = true;
  gguf_require_per_layer(m, s, {"attn_q_norm.weight", "attn_k_norm.weight"});
  return build_decoder(m, s);
}

// GGUF "qwen3moe" (Qwen3-30B-A3B, ...): qwen3's attention, every layer's FFN a mixture of experts
// (expert_count, expert_used_count, expert_feed_forward_length; llama.cpp LLM_ARCH_QWEN3MOE:
// softmax gating, the selected weights normalised).
Graph build_gguf_qwen3moe(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  s.qk_norm = true;
  gguf_require_per_layer(m, s, {"attn_q_norm.weight", "attn_k_norm.weight"});
  gguf_read_moe(m, s, true);
  if (s.n_expert == 0) fail("{}: qwen3moe.expert_count is missing or 0", m.path);
  return build_decoder(m, s);
}

// Qwen3-MoE (Qwen3MoeForCausalLM, model_type qwen3_moe): Qwen3's attention, every layer's MLP a
// mixture of experts (transformers modeling_qwen3_moe.py: softmax router, top num_experts_per_tok,
// renormalised when norm_topk_prob).
Graph build_hf_qwen3moe(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = hf_llama_spec(m, o, false);
  s.qk_norm = true;
  hf_moe(m, s, HfMoe::qwen3);
  return build_decoder(m, s);
}

}  // namespace mk
