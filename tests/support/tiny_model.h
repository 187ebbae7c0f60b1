// A small random-weight Llama ModelFile built in memory (GGUF names and metadata), for tests that
// need a model with particular shapes or dtypes without a file on disk.
#pragma once
#include <random>

#include "model/model_file.h"

namespace mk::test {

struct TinyLlama {
  int64_t n_vocab = 48, n_embd = 32, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 40, n_ctx = 64;
  DType dtype = DType::F32;
  bool tied = false;
  uint64_t seed = 1;
};

inline ModelFile make_tiny_llama(const TinyLlama& c) {
  ModelFile m;
  m.path = "<tiny-llama>";
  m.format = "gguf";
  m.metadata["general.architecture"] = "llama";
  m.metadata["llama.embedding_length"] = c.n_embd;
  m.metadata["llama.block_count"] = c.n_layer;
  m.metadata["llama.attention.head_count"] = c.n_head;
  m.metadata["llama.attention.head_count_kv"] = c.n_head_kv;
  m.metadata["llama.feed_forward_length"] = c.n_ff;
  m.metadata["llama.context_length"] = c.n_ctx;
  m.metadata["llama.attention.layer_norm_rms_epsilon"] = 1e-5;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> nd(0.0f, 0.3f);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool is_norm = false) {
    WeightTensor t;
    t.name = name;
    t.dtype = is_norm ? DType::F32 : c.dtype;
    t.shape = shape;
    int64_t n = t.numel();
    auto buf = std::make_shared<std::vector<uint8_t>>(dtype_bytes(t.dtype, n));
    for (int64_t i = 0; i < n; ++i) {
      float v = is_norm ? 1.0f + 0.1f * nd(rng) : nd(rng);
      if (t.dtype == DType::F32) std::memcpy(buf->data() + 4 * i, &v, 4);
      else {
        uint16_t h = t.dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(buf->data() + 2 * i, &h, 2);
      }
    }
    t.data = buf->data();
    t.nbytes = buf->size();
    m.owned.push_back(buf);
    m.add_tensor(std::move(t));
  };
  int64_t hd = c.n_embd / c.n_head, kv = c.n_head_kv * hd;
  add("token_embd.weight", {c.n_vocab, c.n_embd});
  for (int il = 0; il < c.n_layer; ++il) {
    std::string b = "blk." + std::to_string(il);
    add(b + ".attn_norm.weight", {c.n_embd}, true);
    add(b + ".attn_q.weight", {c.n_embd, c.n_embd});
    add(b + ".attn_k.weight", {kv, c.n_embd});
    add(b + ".attn_v.weight", {kv, c.n_embd});
    add(b + ".attn_output.weight", {c.n_embd, c.n_embd});
    add(b + ".ffn_norm.weight", {c.n_embd}, true);
    add(b + ".ffn_gate.weight", {c.n_ff, c.n_embd});
    add(b + ".ffn_up.weight", {c.n_ff, c.n_embd});
    add(b + ".ffn_down.weight", {c.n_embd, c.n_ff});
  }
  add("output_norm.weight", {c.n_embd}, true);
  if (!c.tied) add("output.weight", {c.n_vocab, c.n_embd});
  return m;
}

}  // namespace mk::test
