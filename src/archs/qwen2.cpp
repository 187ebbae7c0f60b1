// Qwen2 (Qwen2ForCausalLM): the Llama layout with biases on q/k/v (and none on o_proj).
// Source: transformers modeling_qwen2.py. The biases are required here, so a checkpoint that lost
// them fails to load instead of silently computing something else.
#include "archs/hf_common.h"
#include "archs/registry.h"

namespace mk {

Graph build_hf_qwen2(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = hf_llama_spec(m, o, false);  // Qwen2Config defaults tie_word_embeddings to false
  for (int il = 0; il < s.hp.n_layer; ++il)
    for (const char* p : {"q_proj", "k_proj", "v_proj"}) m.get(fmt::format("model.layers.{}.self_attn.{}.bias", il, p));
  return build_decoder(m, s);
}

}  // namespace mk
