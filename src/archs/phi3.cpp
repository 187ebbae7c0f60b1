// Phi-3 (Phi3ForCausalLM): the Llama layout with q/k/v fused into self_attn.qkv_proj and gate/up
// into mlp.gate_up_proj. load_hf_dir registers the parts as row views under the Llama names
// (model/hf.h), so the description is the Llama one; partial_rotary_factor is honoured.
// Source: transformers modeling_phi3.py.
#include "archs/hf_common.h"
#include "archs/registry.h"

namespace mk {

Graph build_hf_phi3(const ModelFile& m, const BuildOptions& o) {
  if (!m.find("model.layers.0.self_attn.q_proj.weight"))
    fail("{}: missing tensor model.layers.0.self_attn.qkv_proj.weight", m.path);
  return build_decoder(m, hf_llama_spec(m, o, false));  // Phi3Config defaults tie_word_embeddings to false
}

}  // namespace mk
