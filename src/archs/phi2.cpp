// Phi-2 / Phi-1.5 (PhiForCausalLM): LayerNorm with bias, one norm per layer read by attention and
// the MLP in parallel (x + attn(ln(x)) + mlp(ln(x))), NEOX RoPE over the first
// partial_rotary_factor of each head (0.4 on Phi-2: 32 of 80), biases on every projection, an
// ungated GELU (tanh) MLP, a classifier with a bias.
//   HF: model.layers.N.{input_layernorm, self_attn.{q,k,v}_proj, self_attn.dense, mlp.fc1, mlp.fc2},
//       model.final_layernorm, lm_head (weight and bias); transformers modeling_phi.py.
//   GGUF "phi2": llama.cpp's converter (Phi2Model) under canonical names, q/k/v separate or fused as
//       attn_qkv (split into views at load: add_gguf_qkv_views); llama.cpp llm_build_phi2.
#include <cmath>

#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"
#include "model/hparams.h"
#include "support/error.h"
#include "support/json.h"

namespace mk {

namespace {

void phi2_common(DecoderSpec& s) {
  s.norm = DecoderSpec::Norm::layer;
  s.parallel_residual = true;
  s.output_bias = true;
  s.ffn_gated = false;
  s.rope_mode = "halves";
}

std::string phi2_hf_tensor_name(const std::string& canonical) {
  if (canonical == "token_embd.weight") return "model.embed_tokens.weight";
  if (canonical == "output_norm.weight") return "model.final_layernorm.weight";
  if (canonical == "output_norm.bias") return "model.final_layernorm.bias";
  if (canonical == "output.weight") return "lm_head.weight";
  if (canonical == "output.bias") return "lm_head.bias";
  if (canonical.rfind("blk.", 0) != 0) return "";
  const size_t dot1 = canonical.find('.', 4), dot2 = canonical.rfind('.');
  if (dot1 == std::string::npos || dot2 <= dot1) return "";
  const std::string p = "model.layers." + canonical.substr(4, dot1 - 4) + ".";
  const std::string part = canonical.substr(dot1 + 1, dot2 - dot1 - 1), suffix = canonical.substr(dot2);
  static const std::pair<const char*, const char*> kParts[] = {
      {"attn_norm", "input_layernorm"}, {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
      {"attn_v", "self_attn.v_proj"},   {"attn_output", "self_attn.dense"}, {"ffn_up", "mlp.fc1"},
      {"ffn_down", "mlp.fc2"},
  };
  for (const auto& [from, to] : kParts)
    if (part == from) return p + to + suffix;
  return "";
}

}  // namespace

Graph build_gguf_phi2(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  s.hp.norm_eps = read_gguf_layer_norm_hparams(m).norm_eps;
  phi2_common(s);
  s.ffn_act = "gelu_tanh";  // llama.cpp's ggml_gelu
  gguf_require_per_layer(m, s, {"attn_norm.bias", "attn_output.bias", "ffn_up.bias", "ffn_down.bias"});
  gguf_require_qkv_bias(m, s);
  m.get("output_norm.bias");
  m.get("output.weight");  // Phi-2 has its own classifier (and its bias, read by build_decoder)
  return build_decoder(m, s);
}

Graph build_hf_phi2(const ModelFile& m, const BuildOptions& o) {
  const auto& c = hf_config(m);
  if (config_bool(c, "qk_layernorm", false)) fail("config.json: Phi qk_layernorm true is not supported");
  DecoderSpec s = hf_llama_spec(m, o, /*tied_default=*/false);  // PhiConfig: tie_word_embeddings false
  if (config_bool(c, "tie_word_embeddings", false)) fail("config.json: Phi with tie_word_embeddings true is not supported");
  phi2_common(s);
  s.resolve = phi2_hf_tensor_name;
  // Every projection and norm has a bias (build_decoder takes them as optional): refused by name.
  for (int64_t il = 0; il < s.hp.n_layer; ++il)
    for (const char* part : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down"})
      if (const std::string name = phi2_hf_tensor_name(fmt::format("blk.{}.{}.bias", il, part)); !m.find(name))
        fail("{}: missing tensor {}", m.path, name);
  for (const char* name : {"model.final_layernorm.bias", "lm_head.weight", "lm_head.bias"})
    if (!m.find(name)) fail("{}: missing tensor {}", m.path, name);
  return build_decoder(m, s);
}

}  // namespace mk
