// llama2.c checkpoint loader (formats: llama2.c run.c `read_checkpoint`/`memory_map_weights` and
// export.py `legacy_export` / `version1_export`).
//
// Legacy format: 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
// seq_len), then float32 arrays, each holding all layers together:
//   token_embedding [vocab, dim], rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim],
//   wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim],
//   w2 [L, dim, hidden], w3 [L, hidden, dim], rms_final [dim],
//   freq_cis_real, freq_cis_imag [seq_len * head_size / 2 each; unused, skipped],
//   wcls [vocab, dim] only when vocab_size < 0 (a separate classifier).
// Version 1 (export.py): u32 magic 0x616b3432 ("ak42"), i32 version, the same 7 int32, u8
// shared_classifier, zero padding to 256 bytes, then float32: rms_att, rms_ffn, rms_final,
// token_embedding, wq, wk, wv, wo, w1, w2, w3, [wcls]. Version 2 (Q8_0 groups) is rejected.
//
// Tensors get GGUF names and [out, in] shapes; metadata is synthesised with GGUF llama keys.
#include <cstring>
#include <map>

#include "model/hparams.h"
#include "model/model_file.h"
#include "support/byte_reader.h"
#include "support/error.h"

namespace mk {
namespace {

constexpr uint32_t kMagic = 0x616b3432;  // "ak42" little-endian
constexpr size_t kLegacyHeaderBytes = 7 * 4;
constexpr size_t kVersionedHeaderBytes = 256;

struct Config {
  int64_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  bool shared_classifier;
};

uint64_t checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  MK_CHECK(!__builtin_mul_overflow(a, b, &r), "size overflow {} * {}", a, b);  // bounds make this impossible
  return r;
}

void validate(const std::string& path, const Config& c) {
  // The shared hyperparameter ranges (model/hparams.h) bound every product formed below.
  auto positive = [&](std::string_view term, const char* name, int64_t v) {
    checked_hparam(term, v, fmt::format("{}: llama2.c header: {}", path, name));
  };
  positive("n_embd", "dim", c.dim);
  positive("n_ff", "hidden_dim", c.hidden_dim);
  positive("n_layer", "n_layers", c.n_layers);
  positive("n_head", "n_heads", c.n_heads);
  positive("n_head_kv", "n_kv_heads", c.n_kv_heads);
  positive("n_vocab", "vocab_size", c.vocab_size);
  positive("n_ctx", "seq_len", c.seq_len);
  if (c.dim % c.n_heads != 0)
    fail("{}: llama2.c header: n_heads = {} does not divide dim = {}", path, c.n_heads, c.dim);
  if (c.n_heads % c.n_kv_heads != 0)
    fail("{}: llama2.c header: n_kv_heads = {} does not divide n_heads = {}", path, c.n_kv_heads, c.n_heads);
  if ((c.dim / c.n_heads) % 2 != 0)
    fail("{}: llama2.c header: head size {} must be even (RoPE rotates pairs)", path, c.dim / c.n_heads);
}

// Reads the 7 header ints; vocab_size keeps its sign here (negative = separate classifier).
Config read_params(ByteReader& r) {
  Config c{};
  c.dim = r.read<int32_t>("header dim");
  c.hidden_dim = r.read<int32_t>("header hidden_dim");
  c.n_layers = r.read<int32_t>("header n_layers");
  c.n_heads = r.read<int32_t>("header n_heads");
  c.n_kv_heads = r.read<int32_t>("header n_kv_heads");
  c.vocab_size = r.read<int32_t>("header vocab_size");
  c.seq_len = r.read<int32_t>("header seq_len");
  return c;
}

}  // namespace

ModelFile load_llama2c(std::shared_ptr<MappedFile> file) {
  const std::string& path = file->path();
  ByteReader r(file->bytes(), path);

  bool versioned = false;
  if (file->size() >= 4) {
    uint32_t magic;
    std::memcpy(&magic, file->data(), 4);
    versioned = magic == kMagic;
  }
  Config c{};
  size_t header_bytes = kLegacyHeaderBytes;
  if (versioned) {
    r.skip(4, "magic");
    int32_t version = r.read<int32_t>("header version");
    if (version == 2)
      fail("{}: llama2.c version 2 checkpoints (Q8_0 export) are not supported; export with version 1 (float32)",
           path);
    if (version != 1) fail("{}: unsupported llama2.c checkpoint version {} at offset 4", path, version);
    c = read_params(r);
    uint8_t shared = r.read<uint8_t>("header shared_classifier");
    if (shared > 1) fail("{}: llama2.c header: shared_classifier flag {} at offset 36 is not 0 or 1", path, shared);
    c.shared_classifier = shared == 1;
    if (c.vocab_size < 0)
      fail("{}: llama2.c header: vocab_size = {} must be positive in a version 1 checkpoint", path, c.vocab_size);
    header_bytes = kVersionedHeaderBytes;
    r.need(header_bytes - r.offset(), "header padding");
  } else {
    c = read_params(r);
    c.shared_classifier = c.vocab_size > 0;
    if (c.vocab_size < 0) c.vocab_size = -c.vocab_size;  // int32 range, so no overflow in int64
  }
  validate(path, c);

  const int64_t head_dim = c.dim / c.n_heads;
  const int64_t kv_dim = c.n_kv_heads * head_dim;
  const int64_t L = c.n_layers;

  // Lay out the file: each entry is one on-disk array (all layers together).
  struct Array {
    const char* name;  // GGUF tensor name with "{}" for the layer, or a global name
    std::vector<int64_t> shape;  // one layer's shape, [out, in]
    bool per_layer;
  };
  std::vector<Array> arrays;
  const Array token_embd{"token_embd.weight", {c.vocab_size, c.dim}, false};
  const Array attn_norm{"blk.{}.attn_norm.weight", {c.dim}, true};
  const Array ffn_norm{"blk.{}.ffn_norm.weight", {c.dim}, true};
  const Array output_norm{"output_norm.weight", {c.dim}, false};
  const Array wq{"blk.{}.attn_q.weight", {c.dim, c.dim}, true};
  const Array wk{"blk.{}.attn_k.weight", {kv_dim, c.dim}, true};
  const Array wv{"blk.{}.attn_v.weight", {kv_dim, c.dim}, true};
  const Array wo{"blk.{}.attn_output.weight", {c.dim, c.dim}, true};
  const Array w1{"blk.{}.ffn_gate.weight", {c.hidden_dim, c.dim}, true};
  const Array w2{"blk.{}.ffn_down.weight", {c.dim, c.hidden_dim}, true};
  const Array w3{"blk.{}.ffn_up.weight", {c.hidden_dim, c.dim}, true};
  const Array freq_cis{nullptr, {2 * c.seq_len * head_dim / 2}, false};  // real + imaginary, skipped
  const Array wcls{"output.weight", {c.vocab_size, c.dim}, false};
  if (versioned) {
    arrays = {attn_norm, ffn_norm, output_norm, token_embd, wq, wk, wv, wo, w1, w2, w3};
  } else {
    arrays = {token_embd, attn_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3, output_norm, freq_cis};
  }
  if (!c.shared_classifier) arrays.push_back(wcls);

  // Every header value is bounded (validate), so these products fit in 64 bits.
  uint64_t expected = header_bytes;
  for (const auto& a : arrays) {
    uint64_t n = 1;
    for (auto d : a.shape) n = checked_mul(n, static_cast<uint64_t>(d));
    if (a.per_layer) n = checked_mul(n, static_cast<uint64_t>(L));
    expected += checked_mul(n, 4);
  }
  if (file->size() != expected)
    fail("{}: llama2.c file size {} bytes does not match the {} bytes implied by the header (dim={} hidden_dim={} "
         "n_layers={} n_heads={} n_kv_heads={} vocab_size={}{} seq_len={})",
         path, file->size(), expected, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
         c.shared_classifier ? " shared classifier" : " separate classifier", c.seq_len);

  ModelFile m;
  m.path = path;
  m.format = "llama2c";
  m.files.push_back(file);

  // Tensors appear in the ModelFile in GGUF order (token_embd, then layer by layer, then output).
  std::map<std::string, WeightTensor> by_name;
  uint64_t off = header_bytes;
  for (const auto& a : arrays) {
    uint64_t nbytes = 4;
    for (auto d : a.shape) nbytes *= static_cast<uint64_t>(d);
    const int64_t count = a.per_layer ? L : 1;
    for (int64_t il = 0; il < count; ++il) {
      if (a.name) {
        WeightTensor t;
        t.name = a.per_layer ? fmt::format(fmt::runtime(a.name), il) : a.name;
        t.dtype = DType::F32;
        t.shape = a.shape;
        t.data = file->data() + off;
        t.nbytes = nbytes;
        t.file_offset = off;
        by_name.emplace(t.name, std::move(t));
      }
      off += nbytes;
    }
  }
  MK_CHECK(off == expected);

  auto take = [&](const std::string& name) {
    auto it = by_name.find(name);
    if (it != by_name.end()) m.add_tensor(std::move(it->second));
  };
  take("token_embd.weight");
  static constexpr const char* kLayerOrder[] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                "ffn_norm", "ffn_gate", "ffn_down", "ffn_up"};
  for (int64_t il = 0; il < L; ++il)
    for (const char* part : kLayerOrder) take(fmt::format("blk.{}.{}.weight", il, part));
  take("output_norm.weight");
  take("output.weight");
  MK_CHECK(m.tensors().size() == by_name.size());

  auto& md = m.metadata;
  md["general.architecture"] = "llama";
  md["llama.embedding_length"] = c.dim;
  md["llama.feed_forward_length"] = c.hidden_dim;
  md["llama.block_count"] = c.n_layers;
  md["llama.attention.head_count"] = c.n_heads;
  md["llama.attention.head_count_kv"] = c.n_kv_heads;
  md["llama.context_length"] = c.seq_len;
  md["llama.attention.layer_norm_rms_epsilon"] = 1e-5;
  md["llama.rope.freq_base"] = 10000.0;
  md["llama.vocab_size"] = c.vocab_size;
  md["llama.rope.dimension_count"] = head_dim;
  return m;
}

ModelFile load_llama2c(const std::string& path) { return load_llama2c(MappedFile::open(path)); }

}  // namespace mk
