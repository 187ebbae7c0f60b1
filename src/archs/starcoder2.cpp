// StarCoder2 (Starcoder2ForCausalLM): the Llama attention (GQA, NEOX RoPE) with LayerNorms that have
// biases, biases on q/k/v/o (use_bias), and an ungated GELU (tanh) MLP with biases.
//   HF: model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
//       mlp.c_fc, mlp.c_proj}, model.norm, lm_head (tied by default); config norm_epsilon; its
//       sliding_window windows every layer (as Mistral); transformers modeling_starcoder2.py.
//   GGUF "starcoder2": llama.cpp's converter (a TextModel: q/k not permuted) under canonical names,
//       starcoder2.attention.layer_norm_epsilon, no window (llama.cpp attends to the whole context, as
//       for Mistral's files); llama.cpp llm_build_starcoder2.
#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"
#include "support/error.h"

namespace mk {

namespace {

void starcoder2_common(DecoderSpec& s) {
  s.norm = DecoderSpec::Norm::layer;
  s.ffn_gated = false;
  s.ffn_act = "gelu_tanh";
}

}  // namespace

Graph build_gguf_starcoder2(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  s.hp.norm_eps = read_gguf_layer_norm_hparams(m).norm_eps;
  starcoder2_common(s);
  gguf_require_per_layer(m, s, {"attn_norm.bias", "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias",
                                "ffn_norm.bias", "ffn_up.bias", "ffn_down.bias"});
  m.get("output_norm.bias");
  return build_decoder(m, s);
}

Graph build_hf_starcoder2(const ModelFile& m, const BuildOptions& o) {
  const auto& c = hf_config(m);
  if (!config_bool(c, "use_bias", true)) fail("config.json: StarCoder2 with use_bias false is not supported");
  DecoderSpec s = hf_llama_spec(m, o, /*tied_default=*/true);  // Starcoder2Config ties by default
  starcoder2_common(s);
  const std::string act = hf_activation(c);
  if (act != "gelu_tanh" && act != "gelu") fail("config.json: StarCoder2 hidden_act {} is not supported", act);
  s.ffn_act = act;
  const bool tied = config_bool(c, "tie_word_embeddings", true);
  s.resolve = [tied](const std::string& canonical) -> std::string {
    if (canonical == "output_norm.bias") return "model.norm.bias";
    if (canonical.starts_with("blk.")) {
      const size_t dot1 = canonical.find('.', 4), dot2 = canonical.rfind('.');
      if (dot1 != std::string::npos && dot2 > dot1) {
        const std::string p = "model.layers." + canonical.substr(4, dot1 - 4) + ".";
        const std::string part = canonical.substr(dot1 + 1, dot2 - dot1 - 1), suffix = canonical.substr(dot2);
        if (part == "ffn_up") return p + "mlp.c_fc" + suffix;
        if (part == "ffn_down") return p + "mlp.c_proj" + suffix;
        if (part == "ffn_gate") return "";
      }
    }
    return hf_llama_tensor_name(canonical, tied);
  };
  for (int64_t il = 0; il < s.hp.n_layer; ++il)
    for (const char* part : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_up", "ffn_down"})
      if (const std::string name = s.resolve(fmt::format("blk.{}.{}.bias", il, part)); !m.find(name))
        fail("{}: missing tensor {}", m.path, name);
  if (!m.find("model.norm.bias")) fail("{}: missing tensor model.norm.bias", m.path);
  return build_decoder(m, s);
}

}  // namespace mk
