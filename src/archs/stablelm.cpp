// StableLM 2 / Stable Code (StableLmForCausalLM): the Llama layout with LayerNorms that have biases,
// RoPE on halves over the first partial_rotary_factor of each head (0.25), optional q/k/v biases
// (use_qkv_bias), and optionally attention and MLP in parallel on one norm (use_parallel_residual).
//   HF: config layer_norm_eps, partial_rotary_factor, use_qkv_bias, use_parallel_residual,
//       qk_layernorm (per-head LayerNorms of q and k: StableLM 2 12B, refused); transformers
//       modeling_stablelm.py.
//   GGUF "stablelm": llama.cpp's converter (a TextModel: q/k not permuted), attention.layer_norm_epsilon,
//       rope.dimension_count; llama.cpp runs a layer in parallel when it has no ffn_norm (the
//       use_parallel_residual key is written true when the config lacks it), as read here.
#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"
#include "support/error.h"

namespace mk {

Graph build_gguf_stablelm(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "halves");
  s.hp.norm_eps = read_gguf_layer_norm_hparams(m).norm_eps;
  s.norm = DecoderSpec::Norm::layer;
  if (m.find("blk.0.attn_q_norm.weight"))
    fail("{}: per-head q/k LayerNorms (blk.0.attn_q_norm.weight: StableLM 2 12B) are not supported", m.path);
  s.parallel_residual = !m.find("blk.0.ffn_norm.weight");
  // q/k/v biases are optional (Stable Code 3B has none), but a file has them in every layer or none
  if (m.find("blk.0.attn_q.bias")) gguf_require_qkv_bias(m, s);
  return build_decoder(m, s);
}

Graph build_hf_stablelm(const ModelFile& m, const BuildOptions& o) {
  const auto& c = hf_config(m);
  if (config_bool(c, "qk_layernorm", false))
    fail("config.json: qk_layernorm true (per-head q/k LayerNorms: StableLM 2 12B) is not supported");
  DecoderSpec s = hf_llama_spec(m, o, /*tied_default=*/false);  // StableLmConfig: tie_word_embeddings false
  s.norm = DecoderSpec::Norm::layer;
  s.parallel_residual = config_bool(c, "use_parallel_residual", false);
  s.resolve = [llama = s.resolve](const std::string& canonical) -> std::string {
    if (canonical == "output_norm.bias") return "model.norm.bias";
    return llama(canonical);
  };
  const bool qkv_bias = config_bool(c, "use_qkv_bias", false);
  for (int64_t il = 0; il < s.hp.n_layer; ++il)
    for (const char* part : {"attn_q", "attn_k", "attn_v"})
      if (const std::string name = s.resolve(fmt::format("blk.{}.{}.bias", il, part)); qkv_bias && !m.find(name))
        fail("{}: config.json sets use_qkv_bias true, but tensor {} is missing", m.path, name);
  return build_decoder(m, s);
}

}  // namespace mk
