#include "model/synth.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "quant/quant.h"
#include "support/error.h"

namespace mk {

namespace {

const SynthSpec kSpecs[] = {
    {"stories110m", 32000, 768, 12, 12, 12, 2048, 1024},
    {"stories15m", 32000, 288, 6, 6, 6, 768, 256},
    {"stories260k", 512, 64, 5, 8, 4, 172, 512},
    {"tiny", 64, 32, 2, 4, 2, 48, 64},
    {"micro", 16, 8, 1, 2, 1, 12, 8},  // golden IR tests: small enough to read
    // Real shapes for the GPU benchmarks (TARGETS.md), bf16 by default; head_dim = n_embd / n_head.
    {"llama3.2-1b", 128256, 2048, 16, 32, 8, 8192, 4096, DType::BF16, 0x5eed, true, 500000.0},
    {"llama3.1-8b", 128256, 4096, 32, 32, 8, 14336, 4096, DType::BF16, 0x5eed, false, 500000.0},
    // Mixtures of experts (n_ff: each expert's).
    {"moe-tiny", 64, 256, 2, 4, 2, 256, 64, DType::F32, 0x5eed, false, 10000.0, 4, 2},  // rows whole blocks of every type
    {"olmoe-1b-7b", 50304, 2048, 16, 16, 16, 1024, 4096, DType::BF16, 0x5eed, false, 10000.0, 64, 8},
};

// Elements per independent random stream: chunk 0 of a tensor uses the tensor's own stream (so
// small tensors keep the values they always had), chunk c > 0 a stream derived from it.
constexpr int64_t kChunk = int64_t{1} << 20;

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

ModelFile make_synthetic_model(const SynthSpec& c, bool with_data) {
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
  m.metadata["llama.rope.freq_base"] = c.rope_theta;
  if (c.n_expert > 0) {
    m.metadata["llama.expert_count"] = c.n_expert;
    m.metadata["llama.expert_used_count"] = c.n_expert_used;
  }
  const unsigned n_threads = std::max(1u, std::thread::hardware_concurrency());
  uint64_t tensor_index = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, int kind) {  // 0 matrix, 1 norm, 2 embedding
    WeightTensor t;
    t.name = name;
    t.dtype = kind == 1 ? DType::F32 : c.dtype;
    // A quantized model: rows that are not whole blocks of the type fall back to q8_0 (32-element
    // blocks; as llama.cpp falls back for K-quants), else stay f32.
    if (dtype_is_quantized(t.dtype) && shape.back() % dtype_block_size(t.dtype))
      t.dtype = shape.back() % 32 == 0 ? DType::Q8_0 : DType::F32;
    const DType stored = t.dtype;
    const bool quantized = dtype_is_quantized(stored);
    if (quantized) t.dtype = DType::F32;  // generated as f32, then quantized row by row below
    t.shape = shape;
    const int64_t n = t.numel();
    const uint64_t stream = c.seed * 0x100000001b3ull + (++tensor_index);
    if (!with_data) {
      t.dtype = stored;
      t.nbytes = dtype_bytes(t.dtype, n);
      m.add_tensor(std::move(t));
      return;
    }
    auto buf = std::make_shared<std::vector<uint8_t>>(dtype_bytes(t.dtype, n));
    const float scale = kind == 0 ? std::sqrt(3.0f / static_cast<float>(shape.back())) : kind == 1 ? 0.1f : 1.0f;
    const float bias = kind == 1 ? 1.0f : 0.0f;
    auto fill = [&](int64_t chunk) {
      SplitMix rng{chunk == 0 ? stream : SplitMix{stream ^ (0xc0ffee0000000000ull + static_cast<uint64_t>(chunk))}.next()};
      const int64_t lo = chunk * kChunk, hi = std::min(n, lo + kChunk);
      if (t.dtype == DType::F32) {
        float* f = reinterpret_cast<float*>(buf->data());
        for (int64_t i = lo; i < hi; ++i) f[i] = bias + scale * rng.uniform();
      } else {
        uint16_t* h = reinterpret_cast<uint16_t*>(buf->data());
        for (int64_t i = lo; i < hi; ++i) {
          float v = bias + scale * rng.uniform();
          h[i] = t.dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
        }
      }
    };
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    if (chunks <= 1 || n_threads == 1) {
      for (int64_t ch = 0; ch < chunks; ++ch) fill(ch);
    } else {
      std::atomic<int64_t> next{0};
      std::vector<std::thread> pool;
      for (int64_t w = 0; w < std::min<int64_t>(n_threads, chunks); ++w)
        pool.emplace_back([&] {
          for (int64_t ch = next++; ch < chunks; ch = next++) fill(ch);
        });
      for (auto& th : pool) th.join();
    }
    if (quantized) {  // rows quantized in parallel (ggml's reference quantize_row_*)
      const quant::QuantType* q = quant::quant_type(stored);
      MK_CHECK(q != nullptr);
      const int64_t K = shape.back(), rows = n / K;
      const size_t row_bytes = dtype_bytes(stored, K);
      auto qbuf = std::make_shared<std::vector<uint8_t>>(dtype_bytes(stored, n));
      const float* f = reinterpret_cast<const float*>(buf->data());
      std::atomic<int64_t> next{0};
      constexpr int64_t kRows = 64;
      auto work = [&] {
        for (int64_t r0 = next.fetch_add(kRows); r0 < rows; r0 = next.fetch_add(kRows))
          for (int64_t r = r0; r < std::min(rows, r0 + kRows); ++r)
            q->quantize_row(f + r * K, qbuf->data() + static_cast<size_t>(r) * row_bytes, K);
      };
      std::vector<std::thread> pool;
      for (unsigned w = 1; w < std::min<int64_t>(n_threads, (rows + kRows - 1) / kRows); ++w) pool.emplace_back(work);
      work();
      for (auto& th : pool) th.join();
      buf = std::move(qbuf);
      t.dtype = stored;
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
    if (c.n_expert > 0) {
      add(b + ".ffn_gate_inp.weight", {c.n_expert, c.n_embd}, 0);
      add(b + ".ffn_gate_exps.weight", {c.n_expert, c.n_ff, c.n_embd}, 0);
      add(b + ".ffn_up_exps.weight", {c.n_expert, c.n_ff, c.n_embd}, 0);
      add(b + ".ffn_down_exps.weight", {c.n_expert, c.n_embd, c.n_ff}, 0);
      continue;
    }
    add(b + ".ffn_gate.weight", {c.n_ff, c.n_embd}, 0);
    add(b + ".ffn_up.weight", {c.n_ff, c.n_embd}, 0);
    add(b + ".ffn_down.weight", {c.n_embd, c.n_ff}, 0);
  }
  add("output_norm.weight", {c.n_embd}, 1);
  if (!c.tied) add("output.weight", {c.n_vocab, c.n_embd}, 0);
  return m;
}

ModelFile load_synthetic_model(const std::string& path, bool with_data) {
  if (path.rfind("synth:", 0) != 0) fail("{}: not a synthetic model path (synth:<name>[:<dtype>])", path);
  std::string rest = path.substr(6), dtype;
  const size_t colon = rest.find(':');
  if (colon != std::string::npos) {
    dtype = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
  }
  SynthSpec s = synthetic_spec(rest);
  auto type_names = [] {
    std::vector<std::string> names = {"f32", "f16", "bf16"};
    for (const quant::QuantType* t : quant::quant_types()) names.emplace_back(dtype_name(t->dtype));
    return fmt::format("{}", fmt::join(names, ", "));
  };
  if (colon != std::string::npos && dtype.empty())
    fail("{}: no type after the ':' (synth:<name>:<type>, types: {}; without ':<type>' the weights are {})", path,
         type_names(), dtype_name(s.dtype));
  if (dtype == "f16") s.dtype = DType::F16;
  else if (dtype == "bf16") s.dtype = DType::BF16;
  else if (dtype == "f32") s.dtype = DType::F32;
  else if (!dtype.empty()) {
    const quant::QuantType* q = nullptr;
    for (const quant::QuantType* t : quant::quant_types())
      if (dtype_name(t->dtype) == dtype) q = t;
    if (!q) fail("{}: unknown dtype '{}' ({})", path, dtype, type_names());
    s.dtype = q->dtype;
  }
  ModelFile m = make_synthetic_model(s, with_data);
  m.path = path;
  // Matrices whose rows are not whole blocks of the type fell back (make_synthetic_model): say which,
  // once per name with the layer index as '*', so a benchmark of "q4_K" knows what it measures.
  std::vector<std::string> fallen;
  std::string fallback_types;
  for (const WeightTensor& t : m.tensors()) {
    if (t.shape.size() < 2 || t.dtype == s.dtype) continue;
    std::string name = t.name;
    if (name.rfind("blk.", 0) == 0) name = "blk.*" + name.substr(name.find('.', 4));
    const std::string entry = fmt::format("{} (rows of {}: {})", name, t.shape.back(), dtype_name(t.dtype));
    if (std::find(fallen.begin(), fallen.end(), entry) == fallen.end()) fallen.push_back(entry);
  }
  // Once per model name and process (run builds a synthetic model twice: shapes, then weights).
  static std::mutex noted_mu;
  static std::set<std::string> noted;
  bool first = false;
  if (!fallen.empty()) {
    std::lock_guard<std::mutex> lock(noted_mu);
    first = noted.insert(path).second;
  }
  if (first)
    std::fprintf(stderr, "%s", fmt::format("note: {}: {} needs rows that are a multiple of {} elements; these fall back: {}\n", path,
                                           dtype_name(s.dtype), dtype_block_size(s.dtype), fmt::join(fallen, ", ")).c_str());
  return m;
}

}  // namespace mk
