// Granite 3 (GraniteForCausalLM): the Llama layout with four multipliers: embeddings x
// embedding_multiplier, attention scores x attention_multiplier (in place of 1/sqrt(head_dim)),
// each attention and FFN output x residual_multiplier before its residual add, logits /
// logits_scaling.
//   HF: config embedding_multiplier, attention_multiplier, residual_multiplier, logits_scaling;
//       transformers modeling_granite.py.
//   GGUF "granite": llama.cpp's converter (GraniteModel, a LlamaModel: q/k permuted) writes them as
//       granite.embedding_scale, granite.attention.scale, granite.residual_scale, granite.logit_scale
//       (it leaves out those the config lacks, and llama.cpp then refuses the file: each is required
//       here too; 0 means none); llama.cpp llm_build_granite.
#include <cmath>
#include <string_view>

#include "archs/gguf_common.h"
#include "archs/hf_common.h"
#include "archs/registry.h"
#include "support/error.h"
#include "support/json.h"

namespace mk {

namespace {

struct Multipliers {
  double embedding = 1, attention = 0, residual = 1, logits = 1;  // attention 0: 1/sqrt(head_dim)
};

void apply(DecoderSpec& s, const Multipliers& k) {
  if (k.embedding != 1) {
    s.embed_scale = true;
    s.embed_scale_value = k.embedding;
  }
  s.attn_scale = k.attention;
  s.residual_scale = k.residual;
  s.logit_scale = k.logits;
}

double positive(double v, const std::string& what) {
  if (!(v > 0) || !std::isfinite(v)) fail("{} = {} must be a positive number", what, v);
  return v;
}

}  // namespace

namespace {
DecoderSpec gguf_granite_spec(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "adjacent");
  const std::string a = s.hp.arch + ".";
  // As llama.cpp: each key is required, and 0 means none (1/sqrt(head_dim) for the attention); a
  // logit scale of 0 would divide by zero.
  Multipliers k;
  auto key = [&](const char* suffix, double none) {
    const std::string name = a + suffix;
    if (!m.has(name)) fail("{}: missing metadata key {} (Granite's multipliers are all required, as llama.cpp reads them)", m.path, name);
    const double v = m.get_float(name, none);
    return v == 0 && std::string_view(suffix) != "logit_scale" ? none : positive(v, m.path + ": " + name);
  };
  k.embedding = key("embedding_scale", 1);
  k.attention = key("attention.scale", 0);
  k.residual = key("residual_scale", 1);
  k.logits = key("logit_scale", 1);
  apply(s, k);
  return s;
}
}  // namespace

Graph build_gguf_granite(const ModelFile& m, const BuildOptions& o) { return build_decoder(m, gguf_granite_spec(m, o)); }

// GGUF "granitemoe" (Granite 3.0 1B-A400M / 3B-A800M): Granite with every layer's FFN a mixture of
// experts, the weights normalised, the FFN output then scaled by residual_scale (llama.cpp
// LLM_ARCH_GRANITE_MOE in llm_build_granite). A shared expert (granitemoeshared's
// expert_shared_feed_forward_length) is refused by name.
Graph build_gguf_granitemoe(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_granite_spec(m, o);
  gguf_read_moe(m, s, true);
  if (s.n_expert == 0) fail("{}: granitemoe.expert_count is missing or 0", m.path);
  return build_decoder(m, s);
}

Graph build_hf_granite(const ModelFile& m, const BuildOptions& o) {
  const auto& c = hf_config(m);
  DecoderSpec s = hf_llama_spec(m, o, /*tied_default=*/false);  // GraniteConfig: tie_word_embeddings false
  auto field = [&](const char* name, double def) {
    if (!c.contains(name) || c[name].is_null()) return def;
    if (!c[name].is_number()) fail("config.json: {} must be a number, got {}", name, clip(c[name].dump()));
    return positive(c[name].get<double>(), std::string("config.json: ") + name);
  };
  Multipliers k;
  k.embedding = field("embedding_multiplier", 1);
  k.attention = field("attention_multiplier", 1);  // GraniteConfig's default (real configs set it)
  k.residual = field("residual_multiplier", 1);
  k.logits = field("logits_scaling", 1);
  apply(s, k);
  return build_decoder(m, s);
}

}  // namespace mk
