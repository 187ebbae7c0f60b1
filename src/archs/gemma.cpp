// Gemma (GemmaForCausalLM): the Llama layout with RMSNorm scaling by (1 + w), embeddings scaled by
// sqrt(hidden_size), a GELU (tanh approximation) gated MLP and tied embeddings.
// Source: transformers modeling_gemma.py (GemmaRMSNorm, GemmaModel's `normalizer`).
#include "archs/hf_common.h"
#include "archs/registry.h"

namespace mk {

Graph build_hf_gemma(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = hf_llama_spec(m, o, true);  // GemmaConfig defaults tie_word_embeddings to true
  s.norm_weight_offset = 1.0;
  s.embed_scale = true;
  return build_decoder(m, s);
}

}  // namespace mk
