// Qwen2 (Qwen2ForCausalLM): the Llama layout with biases on q/k/v (and none on o_proj).
// Source: transformers modeling_qwen2.py. The biases are required here, so a checkpoint that lost
// them fails to load instead of silently computing something else.
#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"

namespace mk {

Graph build_hf_qwen2(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = hf_llama_spec(m, o, false);  // Qwen2Config defaults tie_word_embeddings to false
  for (int il = 0; il < s.hp.n_layer; ++il)
    for (const char* p : {"q_proj", "k_proj", "v_proj"}) m.get(fmt::format("model.layers.{}.self_attn.{}.bias", il, p));
  return build_decoder(m, s);
}

// GGUF "qwen2" (llama.cpp LLM_ARCH_QWEN2): NEOX RoPE (q/k are not permuted by the converter),
// biases blk.N.attn_{q,k,v}.bias required.
Graph build_gguf_qwen2(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  gguf_require_per_layer(m, s, {"attn_q.bias", "attn_k.bias", "attn_v.bias"});
  return build_decoder(m, s);
}

}  // namespace mk
