// Phi-3 (Phi3ForCausalLM): the Llama layout with q/k/v fused into self_attn.qkv_proj and gate/up
// into mlp.gate_up_proj. load_hf_dir registers the parts as row views under the Llama names
// (model/hf.h), so the description is the Llama one; partial_rotary_factor is honoured.
// Source: transformers modeling_phi3.py.
#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"

namespace mk {

Graph build_hf_phi3(const ModelFile& m, const BuildOptions& o) {
  if (!m.find("model.layers.0.self_attn.q_proj.weight"))
    fail("{}: missing tensor model.layers.0.self_attn.qkv_proj.weight", m.path);
  return build_decoder(m, hf_llama_spec(m, o, false));  // Phi3Config defaults tie_word_embeddings to false
}

// GGUF "phi3" (llama.cpp LLM_ARCH_PHI3): NEOX RoPE over phi3.rope.dimension_count dims; the fused
// attn_qkv / ffn_up tensors are split into views at load (add_gguf_phi3_views), ffn_up's second
// half is read as the up projection. LongRoPE files (rope_factors_long/short) are refused.
Graph build_gguf_phi3(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  if (m.find("rope_factors_long.weight") || m.find("rope_factors_short.weight"))
    fail("{}: phi3 LongRoPE (rope_factors_long/short) is not supported", m.path);
  gguf_require_per_layer(m, s, {"attn_q.weight", "ffn_gate.weight"});
  s.resolve = [](const std::string& canonical) {
    if (canonical.ends_with(".ffn_up.weight")) return canonical.substr(0, canonical.size() - 14) + ".ffn_up_half.weight";
    return canonical;
  };
  return build_decoder(m, s);
}

}  // namespace mk
