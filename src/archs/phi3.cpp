// Phi-3 (Phi3ForCausalLM): the Llama layout with q/k/v fused into self_attn.qkv_proj and gate/up
// into mlp.gate_up_proj. load_hf_dir registers the parts as row views under the Llama names
// (model/hf.h), so the description is the Llama one; partial_rotary_factor and LongRoPE
// (rope_scaling type longrope, hf_llama_spec) are honoured.
// Source: transformers modeling_phi3.py.
#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"
#include "model/hparams.h"

namespace mk {

Graph build_hf_phi3(const ModelFile& m, const BuildOptions& o) {
  if (!m.find("model.layers.0.self_attn.q_proj.weight"))
    fail("{}: missing tensor model.layers.0.self_attn.qkv_proj.weight", m.path);
  return build_decoder(m, hf_llama_spec(m, o, false));  // Phi3Config defaults tie_word_embeddings to false
}

// GGUF "phi3" (llama.cpp LLM_ARCH_PHI3): NEOX RoPE over phi3.rope.dimension_count dims; the fused
// attn_qkv / ffn_up tensors are split into views at load (add_gguf_phi3_views), ffn_up's second
// half is read as the up projection. LongRoPE (Phi-3 128k): rope_factors_long.weight when the
// context exceeds phi3.rope.scaling.original_context_length (else the training context), else
// rope_factors_short.weight, divide the frequencies per pair (llama.cpp get_rope_factors);
// phi3.rope.scaling.attn_factor scales the rotated values (gguf_decoder_spec).
Graph build_gguf_phi3(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  const bool has_long = m.find("rope_factors_long.weight"), has_short = m.find("rope_factors_short.weight");
  if (has_long != has_short)
    fail("{}: LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight, the file has only {}", m.path,
         has_long ? "rope_factors_long.weight" : "rope_factors_short.weight");
  if (has_long) {
    if (s.rope_scaling.count("freq_factors")) fail("{}: rope_freqs.weight and LongRoPE factors are both given", m.path);
    const std::string key = s.hp.arch + ".rope.scaling.original_context_length";
    const int64_t orig = m.has(key) ? checked_hparam("n_ctx", m.get_int(key), m.path + ": " + key) : s.hp.n_ctx_train;
    const char* which = s.n_ctx > orig ? "rope_factors_long.weight" : "rope_factors_short.weight";
    s.rope_scaling["freq_factors"] = rope_freq_factors(gguf_rope_factors(m, which, s.n_rot));
  }
  // phi3.attention.sliding_window (the converter writes the config's sliding_window, 0 for none):
  // every layer attends to that many positions, as transformers' Phi3Attention (llama.cpp ignores it;
  // the two agree within the window).
  if (const int64_t w = m.get_int(s.hp.arch + ".attention.sliding_window", 0); w > 0) {
    s.sliding_window = checked_hparam("sliding_window", w, m.path + ": " + s.hp.arch + ".attention.sliding_window");
    s.swa_layers.assign(static_cast<size_t>(s.hp.n_layer), true);
    s.rope_theta_swa = s.rope_theta;
    s.rope_scaling_swa = s.rope_scaling;
  }
  gguf_require_per_layer(m, s, {"attn_q.weight", "ffn_gate.weight"});
  s.resolve = [](const std::string& canonical) {
    if (canonical.ends_with(".ffn_up.weight")) return canonical.substr(0, canonical.size() - 14) + ".ffn_up_half.weight";
    return canonical;
  };
  return build_decoder(m, s);
}

}  // namespace mk
