// Llama family from GGUF keys (llama2.c checkpoints are loaded with synthesised GGUF keys).
// Source: llama.cpp's GGUF key conventions (src/llama-arch.cpp LLM_KV_NAMES, src/llama-model.cpp
// LLM_ARCH_LLAMA); RoPE rotates adjacent pairs in GGUF/llama2.c layouts.
//
// Every `<arch>.*` key is either honoured, accepted because its value changes nothing (a neutral
// value, or information only), or refused by name: a key this reader does not know may change the
// math, so it is an error rather than silently ignored.
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <optional>

#include "archs/gguf_common.h"
#include "archs/registry.h"
#include "model/hparams.h"
#include "support/printable.h"

namespace mk {

namespace {

// `<arch>.<suffix>` keys that this reader honours (read below) or that carry information only.
constexpr const char* kKnownKeys[] = {
    "context_length", "embedding_length", "block_count", "feed_forward_length", "vocab_size",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "rope.dimension_count", "rope.freq_base", "rope.scale_linear",
    "rope.scaling.type", "rope.scaling.factor", "rope.scaling.attn_factor",
    // Used only by YaRN (refused below); no effect on linear or unscaled RoPE.
    "rope.scaling.original_context_length",
    // Whether the model was fine-tuned with the scaling: information only (llama.cpp reads, never uses it).
    "rope.scaling.finetuned",
    // How an embedding model's vectors are pooled (runtime/embed.h model_pooling reads and checks it);
    // the logits do not depend on it.
    "pooling_type",
};

// Further known keys of single families (read by their descriptions, e.g. gemma3.cpp).
struct FamilyKeys {
  const char* arch;
  std::initializer_list<const char*> suffixes;
};
const FamilyKeys kFamilyKeys[] = {
    {"gemma2", {"attention.sliding_window", "attn_logit_softcapping", "final_logit_softcapping"}},
    {"gemma3", {"attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa"}},
    {"phi3", {"attention.sliding_window"}},
    {"gpt2", {"attention.layer_norm_epsilon"}},
    {"phi2", {"attention.layer_norm_epsilon"}},
    {"starcoder2", {"attention.layer_norm_epsilon"}},
    {"stablelm", {"attention.layer_norm_epsilon", "use_parallel_residual"}},
    {"granite", {"attention.scale", "embedding_scale", "residual_scale", "logit_scale"}},
    // Mixture of experts (gguf_read_moe); other families take expert_count 0 only (kNeutralKeys).
    {"llama", {"expert_count", "expert_used_count", "expert_feed_forward_length"}},
    {"qwen3moe", {"expert_count", "expert_used_count", "expert_feed_forward_length"}},
    {"olmoe", {"expert_count", "expert_used_count", "expert_feed_forward_length"}},
    {"granitemoe", {"attention.scale", "embedding_scale", "residual_scale", "logit_scale", "expert_count", "expert_used_count",
                    "expert_feed_forward_length"}},
};

// Keys accepted only at the value that changes nothing (llama.cpp's default for LLM_ARCH_LLAMA).
struct NeutralKey {
  const char* suffix;
  double neutral;
  const char* meaning;
};
constexpr NeutralKey kNeutralKeys[] = {
    {"expert_count", 0, "mixture of experts"},
    {"expert_used_count", 0, "mixture of experts"},
    {"use_parallel_residual", 0, "parallel attention and feed-forward residuals"},
    {"attention.causal", 1, "non-causal attention"},
    {"attention.clamp_kqv", 0, "clamping of q, k and v"},
    {"attention.max_alibi_bias", 0, "ALiBi position biases"},
    {"attention.sliding_window", 0, "sliding-window attention"},
    {"attention.scale", 0, "a custom attention scale"},
    {"attn_logit_softcapping", 0, "attention logit soft-capping"},
    {"final_logit_softcapping", 0, "final logit soft-capping"},
    {"logit_scale", 1, "scaled logits"},
    {"embedding_scale", 1, "scaled embeddings"},
    {"residual_scale", 1, "scaled residuals"},
};

double numeric_value(const ModelFile& m, const std::string& key) {
  const auto& v = m.metadata.at(key);
  if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
  return m.get_float(key, 0);
}

void check_llama_keys(const ModelFile& m, const std::string& a) {
  const std::string prefix = a + ".";
  for (const auto& [key, value] : m.metadata.items()) {
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string suffix = key.substr(prefix.size());
    bool known = false;
    for (const char* k : kKnownKeys) known = known || suffix == k;
    for (const auto& f : kFamilyKeys)
      if (a == f.arch)
        for (const char* k : f.suffixes) known = known || suffix == k;
    if (known) continue;
    const NeutralKey* neutral = nullptr;
    for (const auto& n : kNeutralKeys)
      if (suffix == n.suffix) neutral = &n;
    if (!neutral)
      fail("{}: metadata key {} is not supported for the {} architecture (it may change the model's math)", m.path,
           printable(key), a);
    const double v = numeric_value(m, key);
    if (v != neutral->neutral)
      fail("{}: {} = {}: {} is not supported (only {} is)", m.path, printable(key), v, neutral->meaning, neutral->neutral);
  }
}

// RoPE position scaling: `rope.scaling.type` none|linear with `rope.scaling.factor`, or the older
// `rope.scale_linear` (llama.cpp: freq_scale = 1 / factor, i.e. positions divided by the factor).
// YaRN, LongRoPE and other types are refused by name.
Attrs read_rope_scaling(const ModelFile& m, const std::string& a) {
  const std::string type_key = a + ".rope.scaling.type", factor_key = a + ".rope.scaling.factor",
                    old_key = a + ".rope.scale_linear";
  std::string type = m.has(type_key) ? m.get_str(type_key) : "";
  if (!type.empty() && type != "none" && type != "linear")
    fail("{}: {} = {} is not supported (supported: none, linear)", m.path, type_key, printable(type));
  // The factor: rope.scaling.factor, else rope.scale_linear; both present must agree. 0 means
  // "none" in llama.cpp's converter output.
  std::optional<double> factor;
  for (const std::string& k : {factor_key, old_key}) {
    if (!m.has(k)) continue;
    double f = m.get_float(k, 0);
    if (f < 0) fail("{}: {} = {} must not be negative", m.path, k, f);
    if (f == 0) continue;
    if (factor && *factor != f)
      fail("{}: {} = {} and {} = {} disagree", m.path, factor_key, *factor, old_key, f);
    factor = f;
  }
  if (type.empty()) type = factor ? "linear" : "none";  // the older key alone means linear
  if (type == "none") {
    if (factor && *factor != 1.0)
      fail("{}: {} is none but a scaling factor {} is given", m.path, type_key, *factor);
    return {};
  }
  if (!factor) fail("{}: {} is linear but {} is missing", m.path, type_key, factor_key);
  if (*factor == 1.0) return {};
  return {{"scaling", std::string("linear")}, {"factor", *factor}};
}

}  // namespace

Hparams read_gguf_llama_hparams(const ModelFile& m) {
  const std::string a = m.get_str("general.architecture");
  check_llama_keys(m, a);
  // Each value is range-checked as it is read (model/hparams.h), before any arithmetic.
  auto hparam = [&](std::string_view term, const std::string& suffix, std::optional<int64_t> def = std::nullopt) {
    const std::string key = a + "." + suffix;
    const int64_t v = def && !m.has(key) ? *def : m.get_int(key);
    return checked_hparam(term, v, m.path + ": " + key);
  };
  Hparams hp;
  hp.arch = a;
  hp.n_embd = hparam("n_embd", "embedding_length");
  hp.n_layer = hparam("n_layer", "block_count");
  hp.n_head = hparam("n_head", "attention.head_count");
  hp.n_head_kv = hparam("n_head_kv", "attention.head_count_kv", hp.n_head);
  // Without attention.key_length, head_dim is derived as n_embd / n_head (llama.cpp), which must divide.
  if (!m.has(a + ".attention.key_length") && hp.n_embd % hp.n_head != 0)
    fail("{}: {}.embedding_length = {} is not a multiple of {}.attention.head_count = {} (head_dim = n_embd / n_head, "
         "as the file has no {}.attention.key_length)",
         m.path, a, hp.n_embd, a, hp.n_head, a);
  hp.head_dim = hparam("head_dim", "attention.key_length", hp.n_embd / hp.n_head);
  const int64_t value_length = hparam("head_dim", "attention.value_length", hp.head_dim);
  if (value_length != hp.head_dim)
    fail("{}: {}.attention.value_length {} differs from key_length {} (not supported)", m.path, a, value_length,
         hp.head_dim);
  hp.n_ff = hparam("n_ff", "feed_forward_length");
  hp.n_ctx_train = hparam("n_ctx", "context_length", 2048);
  hp.norm_eps = m.get_float(a + ".attention.layer_norm_rms_epsilon", 1e-5);
  if (!(hp.norm_eps > 0)) fail("{}: {}.attention.layer_norm_rms_epsilon = {} must be positive", m.path, a, hp.norm_eps);
  const WeightTensor& emb = m.get("token_embd.weight");
  if (emb.shape.size() != 2) fail("token_embd.weight: expected 2 dimensions, got {}", shape_str(emb.shape));
  hp.n_vocab = checked_hparam("n_vocab", emb.shape[0], m.path + ": token_embd.weight rows");
  if (m.has(a + ".vocab_size") && hparam("n_vocab", "vocab_size") != hp.n_vocab)
    fail("{}: {}.vocab_size = {} but token_embd.weight has {} rows", m.path, a, m.get_int(a + ".vocab_size"),
         hp.n_vocab);
  return hp;
}

Hparams read_gguf_layer_norm_hparams(const ModelFile& m) {
  Hparams hp = read_gguf_llama_hparams(m);
  const std::string key = hp.arch + ".attention.layer_norm_epsilon";
  hp.norm_eps = m.get_float(key, 1e-5);
  if (!(hp.norm_eps > 0) || !std::isfinite(hp.norm_eps)) fail("{}: {} = {} must be positive", m.path, key, hp.norm_eps);
  return hp;
}

DecoderSpec gguf_decoder_spec(const ModelFile& m, const BuildOptions& o, const char* rope_mode) {
  DecoderSpec s;
  s.hp = read_gguf_llama_hparams(m);
  const std::string& a = s.hp.arch;
  s.n_ctx = o.n_ctx > 0 ? o.n_ctx : s.hp.n_ctx_train;
  s.all_logits = o.all_logits;
  s.embeddings = o.embeddings;
  s.kv_pool_tokens = o.kv_pool_tokens;
  s.kv_block_size = o.kv_block_size;
  s.rope_mode = rope_mode;
  s.rope_theta = m.get_float(a + ".rope.freq_base", 10000.0);
  s.n_rot = checked_hparam("n_rot", m.get_int(a + ".rope.dimension_count", s.hp.head_dim),
                           m.path + ": " + a + ".rope.dimension_count");
  if (s.n_rot <= 0 || s.n_rot > s.hp.head_dim || s.n_rot % 2 != 0)
    fail("{}: {}.rope.dimension_count must be even and in (0, head_dim {}], got {}{}", m.path, a, s.hp.head_dim, s.n_rot,
         m.has(a + ".attention.key_length") ? std::string()
                                                        : fmt::format(" (head_dim = embedding_length {} / head_count {})", s.hp.n_embd, s.hp.n_head));
  s.rope_scaling = read_rope_scaling(m, a);
  // llama.cpp's converter writes Llama 3 RoPE scaling as rope_freqs.weight: one factor per rotated
  // pair, each frequency divided by its factor (ggml_rope_ext's freq_factors).
  if (m.find("rope_freqs.weight"))
    s.rope_scaling["freq_factors"] = rope_freq_factors(gguf_rope_factors(m, "rope_freqs.weight", s.n_rot));
  // rope.scaling.attn_factor multiplies the rotated values (llama.cpp: cparams.yarn_attn_factor *= it).
  const std::string attn_key = a + ".rope.scaling.attn_factor";
  s.rope_attn_factor = m.get_float(attn_key, 1.0);
  if (!(s.rope_attn_factor > 0) || !std::isfinite(s.rope_attn_factor))
    fail("{}: {} = {} must be a positive number", m.path, attn_key, s.rope_attn_factor);
  return s;
}

std::vector<double> gguf_rope_factors(const ModelFile& m, const std::string& name, int64_t n_rot) {
  const WeightTensor& t = m.get(name);
  if (t.dtype != DType::F32 || t.shape != std::vector<int64_t>{n_rot / 2})
    fail("{}: {} must be f32[{}] (one factor per rotated pair), got {}{}", m.path, name, n_rot / 2, dtype_name(t.dtype),
         shape_str(t.shape));
  std::vector<double> r;
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    float f;
    std::memcpy(&f, t.data + i * 4, 4);
    if (!(f > 0) || !std::isfinite(f)) fail("{}: {}[{}] = {} must be a positive number", m.path, name, i, f);
    r.push_back(f);
  }
  return r;
}

void gguf_require_per_layer(const ModelFile& m, const DecoderSpec& s, std::initializer_list<const char*> names) {
  for (int64_t il = 0; il < s.hp.n_layer; ++il)
    for (const char* n : names) m.get(fmt::format("blk.{}.{}", il, n));
}

void gguf_require_qkv_bias(const ModelFile& m, const DecoderSpec& s) {
  for (int64_t il = 0; il < s.hp.n_layer; ++il) {
    const std::string p = fmt::format("blk.{}.", il);
    if (m.find(p + "attn_qkv.weight"))
      m.get(p + "attn_qkv.bias");
    else if (!m.find(p + "attn_q.weight"))
      fail("{}: missing tensor {}attn_qkv.weight (or {}attn_q/attn_k/attn_v.weight)", m.path, p, p);
    else
      for (const char* n : {"attn_q.bias", "attn_k.bias", "attn_v.bias"}) m.get(p + n);
  }
}

void gguf_read_moe(const ModelFile& m, DecoderSpec& s, bool norm) {
  const std::string& a = s.hp.arch;
  const std::string count_key = a + ".expert_count", used_key = a + ".expert_used_count";
  const int64_t n_expert = m.has(count_key) ? m.get_int(count_key) : 0;
  if (n_expert == 0) {
    if (m.has(used_key) && m.get_int(used_key) != 0)
      fail("{}: {} = {} without experts ({} is 0 or absent)", m.path, used_key, m.get_int(used_key), count_key);
    return;
  }
  s.n_expert = checked_hparam("n_expert", n_expert, m.path + ": " + count_key);
  s.n_expert_used = checked_hparam("n_expert_used", m.get_int(used_key), m.path + ": " + used_key);
  if (s.n_expert_used > s.n_expert)
    fail("{}: {} = {} exceeds {} = {}", m.path, used_key, s.n_expert_used, count_key, s.n_expert);
  const std::string ff_key = a + ".expert_feed_forward_length";
  s.n_ff_exp = checked_hparam("n_ff", m.has(ff_key) ? m.get_int(ff_key) : s.hp.n_ff, m.path + ": " + ff_key);
  s.moe_norm = norm;
}

// Mixtral is a llama GGUF with experts (llama.cpp LLM_ARCH_LLAMA: build_moe_ffn with the weights
// normalised).
Graph build_gguf_llama(const ModelFile& m, const BuildOptions& o) {
  DecoderSpec s = gguf_decoder_spec(m, o, "adjacent");
  gguf_read_moe(m, s, true);
  return build_decoder(m, s);
}

}  // namespace mk
