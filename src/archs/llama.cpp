// Llama family from GGUF keys (llama2.c checkpoints are loaded with synthesised GGUF keys).
// Source: llama.cpp's GGUF key conventions; RoPE rotates adjacent pairs in GGUF/llama2.c layouts.
#include "archs/gguf_common.h"
#include "archs/registry.h"

namespace mk {

Hparams read_gguf_llama_hparams(const ModelFile& m) {
  const std::string a = m.get_str("general.architecture");
  Hparams hp;
  hp.arch = a;
  hp.n_embd = m.get_int(a + ".embedding_length");
  hp.n_layer = m.get_int(a + ".block_count");
  hp.n_head = m.get_int(a + ".attention.head_count");
  hp.n_head_kv = m.get_int(a + ".attention.head_count_kv", hp.n_head);
  hp.head_dim = m.get_int(a + ".attention.key_length", hp.n_head > 0 ? hp.n_embd / hp.n_head : 0);
  hp.n_ff = m.get_int(a + ".feed_forward_length");
  hp.n_ctx_train = m.get_int(a + ".context_length", 2048);
  hp.norm_eps = m.get_float(a + ".attention.layer_norm_rms_epsilon", 1e-5);
  const WeightTensor& emb = m.get("token_embd.weight");
  if (emb.shape.size() != 2) fail("token_embd.weight: expected 2 dimensions, got {}", shape_str(emb.shape));
  hp.n_vocab = emb.shape[0];
  return hp;
}

DecoderSpec gguf_decoder_spec(const ModelFile& m, const BuildOptions& o, const char* rope_mode) {
  DecoderSpec s;
  s.hp = read_gguf_llama_hparams(m);
  const std::string& a = s.hp.arch;
  s.n_ctx = o.n_ctx > 0 ? o.n_ctx : s.hp.n_ctx_train;
  s.all_logits = o.all_logits;
  s.rope_mode = rope_mode;
  s.rope_theta = m.get_float(a + ".rope.freq_base", 10000.0);
  s.n_rot = m.get_int(a + ".rope.dimension_count", s.hp.head_dim);
  if (s.n_rot <= 0 || s.n_rot > s.hp.head_dim || s.n_rot % 2 != 0)
    fail("{}: {}.rope.dimension_count must be even and in (0, head_dim {}], got {}", m.path, a, s.hp.head_dim, s.n_rot);
  return s;
}

void gguf_require_per_layer(const ModelFile& m, const DecoderSpec& s, std::initializer_list<const char*> names) {
  for (int64_t il = 0; il < s.hp.n_layer; ++il)
    for (const char* n : names) m.get(fmt::format("blk.{}.{}", il, n));
}

Graph build_gguf_llama(const ModelFile& m, const BuildOptions& o) {
  return build_decoder(m, gguf_decoder_spec(m, o, "adjacent"));
}

}  // namespace mk
