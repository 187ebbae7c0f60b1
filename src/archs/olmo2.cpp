// OLMo 2 (Olmo2ForCausalLM): the Llama layout without the pre-norms: each layer's attention and MLP
// read the residual stream itself, and their outputs are RMS-normalized before each residual add
// (post_attention / post_feedforward norms); q and k are RMS-normalized over their whole
// projections (n_head x head_dim and n_head_kv x head_dim wide), before RoPE on halves (NEOX).
//   HF: model.layers.N.{self_attn.{q,k,v,o}_proj, self_attn.q_norm, self_attn.k_norm,
//       post_attention_layernorm, post_feedforward_layernorm, mlp.*}; transformers modeling_olmo2.py.
//   GGUF "olmo2": llama.cpp's converter (Olmo2Model: no q/k permutation), blk.N.attn_q_norm /
//       attn_k_norm, post_attention_norm, post_ffw_norm; llama.cpp llm_build_olmo2.
#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"
#include "support/error.h"

namespace mk {

namespace {

void olmo2_common(DecoderSpec& s) {
  s.pre_norms = false;
  s.post_norms = true;
  s.qk_norm = true;
  s.qk_norm_full = true;
}

}  // namespace

Graph build_gguf_olmo2(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  olmo2_common(s);
  return build_decoder(m, s);
}

Graph build_hf_olmo2(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = hf_llama_spec(m, o, /*tied_default=*/false);  // Olmo2Config: tie_word_embeddings false
  olmo2_common(s);
  s.resolve = [llama = s.resolve](const std::string& canonical) -> std::string {
    if (canonical.starts_with("blk.")) {
      const size_t dot1 = canonical.find('.', 4), dot2 = canonical.rfind('.');
      if (dot1 != std::string::npos && dot2 > dot1) {
        const std::string p = "model.layers." + canonical.substr(4, dot1 - 4) + ".";
        const std::string part = canonical.substr(dot1 + 1, dot2 - dot1 - 1), suffix = canonical.substr(dot2);
        if (part == "post_attention_norm") return p + "post_attention_layernorm" + suffix;
        if (part == "post_ffw_norm") return p + "post_feedforward_layernorm" + suffix;
      }
    }
    return llama(canonical);
  };
  return build_decoder(m, s);
}

// OLMoE (OlmoeForCausalLM, GGUF "olmoe"): the Llama layout (pre-norms) with q and k RMS-normalized
// over their whole projections as OLMo 2, NEOX RoPE, and every layer's MLP a mixture of experts whose
// weights are not renormalised (llama.cpp llm_build_olmoe: build_moe_ffn with norm_w false;
// transformers OlmoeConfig norm_topk_prob false by default).
Graph build_gguf_olmoe(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  s.qk_norm = true;
  s.qk_norm_full = true;
  gguf_read_moe(m, s, false);
  if (s.n_expert == 0) fail("{}: olmoe.expert_count is missing or 0", m.path);
  return build_decoder(m, s);
}

Graph build_hf_olmoe(const ModelFile& m, const BuildOptions& o) {
  const auto& c = hf_config(m);
  if (c.contains("clip_qkv") && !c["clip_qkv"].is_null()) fail("config.json: clip_qkv (clamping q, k and v) is not supported");
  DecoderSpec s = hf_llama_spec(m, o, /*tied_default=*/false);
  s.qk_norm = true;
  s.qk_norm_full = true;
  hf_moe(m, s, HfMoe::olmoe);
  return build_decoder(m, s);
}

}  // namespace mk
