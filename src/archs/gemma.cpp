// Gemma (GemmaForCausalLM): the Llama layout with RMSNorm scaling by (1 + w), embeddings scaled by
// sqrt(hidden_size), a GELU (tanh approximation) gated MLP and tied embeddings.
// Source: transformers modeling_gemma.py (GemmaRMSNorm, GemmaModel's `normalizer`).
#include <cmath>

#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"

namespace mk {

Graph build_hf_gemma(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = hf_llama_spec(m, o, true);  // GemmaConfig defaults tie_word_embeddings to true
  s.norm_weight_offset = 1.0;
  s.embed_scale = true;
  if (hf_bf16_buffers(hf_config(m))) {
    const float scale = std::sqrt(static_cast<float>(s.hp.n_embd));
    s.embed_scale_value = static_cast<double>(bf16_to_f32(f32_to_bf16(scale)));
  }
  return build_decoder(m, s);
}

// GGUF "gemma": llama.cpp's converter stores the norm weights as (1 + w), so the norms are plain
// RMSNorm here; NEOX RoPE, embeddings * sqrt(n_embd), GELU (tanh) gated FFN, tied classifier
// unless output.weight is present.
Graph build_gguf_gemma(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  s.embed_scale = true;
  s.ffn_act = "gelu_tanh";
  return build_decoder(m, s);
}

}  // namespace mk
