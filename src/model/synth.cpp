#include "model/synth.h"

#include <fmt/ranges.h>

#include <cmath>
#include <cstring>

#include "support/error.h"

namespace mk {

namespace {

const SynthSpec kSpecs[] = {
    {"stories110m", 32000, 768, 12, 12, 12, 2048, 1024},
    {"stories15m", 32000, 288, 6, 6, 6, 768, 256},
    {"stories260k", 512, 64, 5, 8, 4, 172, 512},
    {"tiny", 64, 32, 2, 4, 2, 48, 64},
    {"micro", 16, 8, 1, 2, 1, 12, 8},  // golden IR tests: small enough to read
};

// splitmix64: a fast generator whose stream depends only on the seed.
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }  // [-1, 1)
};

}  // namespace

SynthSpec synthetic_spec(const std::string& name) {
  for (const auto& s : kSpecs)
    if (name == s.name) return s;
  fail("unknown synthetic model '{}'; available: {}", name, fmt::join(synthetic_model_names(), ", "));
}

std::vector<std::string> synthetic_model_names() {
  std::vector<std::string> r;
  for (const auto& s : kSpecs) r.push_back(s.name);
  return r;
}

ModelFile make_synthetic_model(const SynthSpec& c) {
  ModelFile m;
  m.path = "synth:" + c.name;
  m.format = "gguf";  // GGUF names and keys, so the llama description reads it
  m.metadata["general.architecture"] = "llama";
  m.metadata["general.name"] = "synthetic " + c.name;
  m.metadata["llama.embedding_length"] = c.n_embd;
  m.metadata["llama.block_count"] = c.n_layer;
  m.metadata["llama.attention.head_count"] = c.n_head;
  m.metadata["llama.attention.head_count_kv"] = c.n_head_kv;
  m.metadata["llama.feed_forward_length"] = c.n_ff;
  m.metadata["llama.context_length"] = c.n_ctx;
  m.metadata["llama.attention.layer_norm_rms_epsilon"] = 1e-5;
  m.metadata["llama.rope.freq_base"] = 10000.0;
  uint64_t tensor_index = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, int kind) {  // 0 matrix, 1 norm, 2 embedding
    WeightTensor t;
    t.name = name;
    t.dtype = kind == 1 ? DType::F32 : c.dtype;
    t.shape = shape;
    const int64_t n = t.numel();
    auto buf = std::make_shared<std::vector<uint8_t>>(dtype_bytes(t.dtype, n));
    SplitMix rng{c.seed * 0x100000001b3ull + (++tensor_index)};
    const float scale = kind == 0 ? std::sqrt(3.0f / static_cast<float>(shape.back())) : kind == 1 ? 0.1f : 1.0f;
    const float bias = kind == 1 ? 1.0f : 0.0f;
    if (t.dtype == DType::F32) {
      float* f = reinterpret_cast<float*>(buf->data());
      for (int64_t i = 0; i < n; ++i) f[i] = bias + scale * rng.uniform();
    } else {
      uint16_t* h = reinterpret_cast<uint16_t*>(buf->data());
      for (int64_t i = 0; i < n; ++i) {
        float v = bias + scale * rng.uniform();
        h[i] = t.dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      }
    }
    t.data = buf->data();
    t.nbytes = buf->size();
    m.owned.push_back(std::move(buf));
    m.add_tensor(std::move(t));
  };
  const int64_t hd = c.n_embd / c.n_head, kv = c.n_head_kv * hd;
  add("token_embd.weight", {c.n_vocab, c.n_embd}, 2);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    std::string b = "blk." + std::to_string(il);
    add(b + ".attn_norm.weight", {c.n_embd}, 1);
    add(b + ".attn_q.weight", {c.n_embd, c.n_embd}, 0);
    add(b + ".attn_k.weight", {kv, c.n_embd}, 0);
    add(b + ".attn_v.weight", {kv, c.n_embd}, 0);
    add(b + ".attn_output.weight", {c.n_embd, c.n_embd}, 0);
    add(b + ".ffn_norm.weight", {c.n_embd}, 1);
    add(b + ".ffn_gate.weight", {c.n_ff, c.n_embd}, 0);
    add(b + ".ffn_up.weight", {c.n_ff, c.n_embd}, 0);
    add(b + ".ffn_down.weight", {c.n_embd, c.n_ff}, 0);
  }
  add("output_norm.weight", {c.n_embd}, 1);
  add("output.weight", {c.n_vocab, c.n_embd}, 0);
  return m;
}

ModelFile load_synthetic_model(const std::string& path) {
  if (path.rfind("synth:", 0) != 0) fail("{}: not a synthetic model path (synth:<name>[:<dtype>])", path);
  std::string rest = path.substr(6), dtype;
  if (auto colon = rest.find(':'); colon != std::string::npos) {
    dtype = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
  }
  SynthSpec s = synthetic_spec(rest);
  if (dtype == "f16") s.dtype = DType::F16;
  else if (dtype == "bf16") s.dtype = DType::BF16;
  else if (!dtype.empty() && dtype != "f32") fail("{}: unknown dtype '{}' (f32, f16, bf16)", path, dtype);
  ModelFile m = make_synthetic_model(s);
  m.path = path;
  return m;
}

}  // namespace mk
