// GPT-2 (GPT2LMHeadModel): LayerNorm with bias, learned position embeddings (wpe), no RoPE, a plain
// (ungated) GELU-tanh MLP, biases on every projection, classifier tied to wte.
// The Conv1D weights ([n_in, n_out]) are registered transposed by load_hf_dir (model/hf.h).
// GGUF "gpt2" (llama.cpp LLM_ARCH_GPT2): the same model under canonical names, Conv1D weights
// already transposed by the converter, c_attn fused as attn_qkv (split into views at load:
// add_gguf_qkv_views), classifier output.weight or tied to token_embd.
// Source: transformers modeling_gpt2.py; llama.cpp convert_hf_to_gguf.py GPT2Model, llm_build_gpt2.
#include <cmath>

#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"
#include "model/hparams.h"

namespace mk {

namespace {

std::string gpt2_tensor_name(const std::string& canonical) {
  if (canonical == "token_embd.weight") return "transformer.wte.weight";
  if (canonical == "position_embd.weight") return "transformer.wpe.weight";
  if (canonical == "output_norm.weight") return "transformer.ln_f.weight";
  if (canonical == "output_norm.bias") return "transformer.ln_f.bias";
  if (canonical.rfind("blk.", 0) != 0) return "";  // output.weight: tied to wte
  const size_t dot1 = canonical.find('.', 4), dot2 = canonical.rfind('.');
  if (dot1 == std::string::npos || dot2 <= dot1) return "";
  const std::string p = "transformer.h." + canonical.substr(4, dot1 - 4) + ".";
  const std::string part = canonical.substr(dot1 + 1, dot2 - dot1 - 1), suffix = canonical.substr(dot2);
  const bool w = suffix == ".weight";
  if (part == "attn_norm") return p + "ln_1" + suffix;
  if (part == "ffn_norm") return p + "ln_2" + suffix;
  if (part == "attn_q") return p + "attn.q_proj" + suffix;
  if (part == "attn_k") return p + "attn.k_proj" + suffix;
  if (part == "attn_v") return p + "attn.v_proj" + suffix;
  if (part == "attn_output") return p + (w ? "attn.o_proj.weight" : "attn.c_proj.bias");
  if (part == "ffn_up") return p + (w ? "mlp.up_proj.weight" : "mlp.c_fc.bias");
  if (part == "ffn_down") return p + (w ? "mlp.down_proj.weight" : "mlp.c_proj.bias");
  return "";
}

// GPT-2's spec for hyperparameters `hp` (either format's): LayerNorm, learned positions (the context
// at most n_ctx_train), no RoPE, an ungated MLP of `act`.
DecoderSpec gpt2_spec(const ModelFile& m, const Hparams& hp, const BuildOptions& o, std::string act) {
  DecoderSpec s;
  s.hp = hp;
  s.n_ctx = o.n_ctx > 0 ? o.n_ctx : s.hp.n_ctx_train;
  if (s.n_ctx > s.hp.n_ctx_train)
    fail("{}: context of {} tokens exceeds GPT-2's {} learned positions", m.path, s.n_ctx, s.hp.n_ctx_train);
  s.all_logits = o.all_logits;
  s.embeddings = o.embeddings;
  s.kv_pool_tokens = o.kv_pool_tokens;
  s.kv_block_size = o.kv_block_size;
  s.norm = DecoderSpec::Norm::layer;
  s.learned_positions = true;
  s.n_rot = -1;
  s.ffn_gated = false;
  s.ffn_act = std::move(act);
  return s;
}

}  // namespace

Graph build_hf_gpt2(const ModelFile& m, const BuildOptions& o) {
  const auto& c = hf_config(m);
  DecoderSpec s = gpt2_spec(m, read_hf_hparams(m), o, hf_activation(c));
  for (const char* k : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"})
    if (c.contains(k) && c[k].is_boolean() && c[k].get<bool>()) fail("config.json: GPT-2 option {} is not supported", k);
  if (c.contains("scale_attn_weights") && c["scale_attn_weights"].is_boolean() && !c["scale_attn_weights"].get<bool>())
    s.attn_scale = 1.0;
  s.resolve = gpt2_tensor_name;
  // Every projection and LayerNorm of GPT-2 has a bias: a checkpoint without them is refused by name
  // (build_decoder takes biases as optional).
  for (int64_t il = 0; il < s.hp.n_layer; ++il)
    for (const char* part : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_up", "ffn_down"})
      if (const std::string name = gpt2_tensor_name(fmt::format("blk.{}.{}.bias", il, part)); !m.find(name))
        fail("{}: missing tensor {}", m.path, name);
  return build_decoder(m, s);
}

Hparams read_gguf_gpt2_hparams(const ModelFile& m) {
  Hparams hp = read_gguf_layer_norm_hparams(m);
  if (hp.head_dim * hp.n_head != hp.n_embd || hp.n_head_kv != hp.n_head)
    fail("{}: GPT-2 attention needs head_count x head_dim = embedding_length and no grouped heads, got {} x {} = {} "
         "(head_count_kv {})",
         m.path, hp.n_head, hp.head_dim, hp.n_embd, hp.n_head_kv);
  return hp;
}

Graph build_gguf_gpt2(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gpt2_spec(m, read_gguf_gpt2_hparams(m), o, "gelu_tanh");  // llama.cpp's ggml_gelu, transformers' gelu_new
  m.get("position_embd.weight", {s.hp.n_ctx_train, s.hp.n_embd});
  // Every projection and LayerNorm of GPT-2 has a bias (build_decoder takes biases as optional).
  gguf_require_per_layer(m, s, {"attn_norm.bias", "attn_output.bias", "ffn_norm.bias", "ffn_up.bias", "ffn_down.bias"});
  gguf_require_qkv_bias(m, s);
  m.get("output_norm.bias");
  return build_decoder(m, s);
}

}  // namespace mk
