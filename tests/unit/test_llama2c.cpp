// llama2.c checkpoint loader tests: the real stories260K.bin (and its equality with the GGUF
// conversion of the same weights), crafted legacy and version-1 files, and damaged headers/sizes.
#include <gtest/gtest.h>

#include "support/errors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "model/model_file.h"
#include "support/error.h"

using namespace mk;

namespace {

const std::string kDir = std::string(MK_SHARED_DIR) + "/models/stories260K/";
const std::string kBinPath = kDir + "stories260K.bin";
const std::string kGgufPath = kDir + "stories260K.gguf";

template <class T>
std::string raw(T v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}

struct Params {
  int32_t dim = 8, hidden_dim = 12, n_layers = 2, n_heads = 2, n_kv_heads = 1, vocab_size = 10, seq_len = 6;
};

std::string header(const Params& p) {
  return raw(p.dim) + raw(p.hidden_dim) + raw(p.n_layers) + raw(p.n_heads) + raw(p.n_kv_heads) + raw(p.vocab_size) +
         raw(p.seq_len);
}

// Number of float32 values after the header that a legacy file with these params holds.
int64_t legacy_floats(const Params& p) {
  int64_t d = p.dim, h = p.hidden_dim, L = p.n_layers, v = std::abs(p.vocab_size);
  int64_t kv = d / p.n_heads * p.n_kv_heads, hs = d / p.n_heads;
  int64_t n = v * d + L * d + L * d * d + 2 * L * kv * d + L * d * d + L * d + 3 * L * h * d + d;
  n += p.seq_len * hs;  // freq_cis real + imaginary
  if (p.vocab_size < 0) n += v * d;
  return n;
}

// A legacy file whose float i (counted from the end of the header) has the value i.
std::string legacy_file(const Params& p) {
  std::string s = header(p);
  int64_t n = legacy_floats(p);
  for (int64_t i = 0; i < n; ++i) s += raw(static_cast<float>(i));
  return s;
}

ModelFile load_bytes(std::string bytes) { return load_llama2c(MappedFile::from_bytes(std::move(bytes), "test.bin")); }

using test::error_of;

void expect_error(const std::string& bytes, const std::string& substring) {
  std::string msg = error_of([&] { load_bytes(bytes); });
  EXPECT_NE(msg.find(substring), std::string::npos) << "expected \"" << substring << "\" in: " << msg;
  EXPECT_NE(msg.find("test.bin"), std::string::npos) << "error does not name the file: " << msg;
}

float first_float(const WeightTensor& t) {
  float f;
  std::memcpy(&f, t.data, 4);
  return f;
}

std::string read_file(const std::string& path) {
  auto f = MappedFile::open(path);
  return std::string(reinterpret_cast<const char*>(f->data()), f->size());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The real file.

TEST(Llama2cReal, LoadsStories260K) {
  ModelFile m = load_llama2c(kBinPath);
  EXPECT_EQ(m.format, "llama2c");
  EXPECT_EQ(m.path, kBinPath);
  ASSERT_EQ(m.tensors().size(), 47u);  // the classifier is shared with the token embedding
  EXPECT_EQ(m.find("output.weight"), nullptr);
  EXPECT_EQ(m.get_str("general.architecture"), "llama");
  EXPECT_EQ(m.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(m.get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(m.get_int("llama.block_count"), 5);
  EXPECT_EQ(m.get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(m.get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(m.get_int("llama.context_length"), 512);
  EXPECT_EQ(m.get_int("llama.vocab_size"), 512);
  EXPECT_EQ(m.get_int("llama.rope.dimension_count"), 8);
  EXPECT_DOUBLE_EQ(m.get_float("llama.attention.layer_norm_rms_epsilon", 0), 1e-5);
  EXPECT_DOUBLE_EQ(m.get_float("llama.rope.freq_base", 0), 10000.0);

  // GGUF order: token_embd, then each layer's nine tensors, then output_norm.
  EXPECT_EQ(m.tensors().front().name, "token_embd.weight");
  EXPECT_EQ(m.tensors()[1].name, "blk.0.attn_norm.weight");
  EXPECT_EQ(m.tensors()[9].name, "blk.0.ffn_up.weight");
  EXPECT_EQ(m.tensors()[10].name, "blk.1.attn_norm.weight");
  EXPECT_EQ(m.tensors().back().name, "output_norm.weight");

  const auto& emb = m.get("token_embd.weight", {512, 64});
  EXPECT_EQ(emb.file_offset, 28u);
  EXPECT_EQ(emb.nbytes, 512u * 64 * 4);
  // rms_att of all layers follows the embedding.
  EXPECT_EQ(m.get("blk.0.attn_norm.weight", {64}).file_offset, 28u + 512 * 64 * 4);
  EXPECT_EQ(m.get("blk.1.attn_norm.weight", {64}).file_offset, 28u + 512 * 64 * 4 + 64 * 4);
  for (int il = 0; il < 5; ++il) {
    std::string p = "blk." + std::to_string(il) + ".";
    m.get(p + "attn_q.weight", {64, 64});
    m.get(p + "attn_k.weight", {32, 64});
    m.get(p + "attn_v.weight", {32, 64});
    m.get(p + "attn_output.weight", {64, 64});
    m.get(p + "ffn_norm.weight", {64});
    m.get(p + "ffn_gate.weight", {172, 64});
    m.get(p + "ffn_down.weight", {64, 172});
    m.get(p + "ffn_up.weight", {172, 64});
  }
  const auto& norm = m.get("output_norm.weight", {64});
  // freq_cis tables (2 * 512 * 8 / 2 floats) follow the final norm and end the file.
  EXPECT_EQ(norm.file_offset + norm.nbytes + 512u * 8 * 4, m.files.at(0)->size());
}

TEST(Llama2cReal, SameWeightsAsGguf) {
  ModelFile bin = load_llama2c(kBinPath);
  ModelFile gguf = load_gguf(kGgufPath);
  for (const auto& t : bin.tensors()) {
    SCOPED_TRACE(t.name);
    const WeightTensor& g = gguf.get(t.name, t.shape);
    ASSERT_EQ(g.dtype, DType::F32);
    ASSERT_EQ(g.nbytes, t.nbytes);
    EXPECT_EQ(std::memcmp(g.data, t.data, t.nbytes), 0);
  }
  // The GGUF stores the shared classifier explicitly.
  const auto& out = gguf.get("output.weight");
  const auto& emb = bin.get("token_embd.weight");
  EXPECT_EQ(std::memcmp(out.data, emb.data, emb.nbytes), 0);
  // A few individual values, read as floats.
  for (const char* name : {"token_embd.weight", "blk.2.attn_k.weight", "blk.4.ffn_down.weight", "output_norm.weight"}) {
    float a[3], b[3];
    std::memcpy(a, bin.get(name).data + 40, sizeof a);
    std::memcpy(b, gguf.get(name).data + 40, sizeof b);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(a[i], b[i]) << name << "[" << 10 + i << "]";
    EXPECT_NE(a[0], 0.0f) << name;
  }
}

TEST(Llama2cReal, LoadModelFallsBackToLlama2c) {
  ModelFile m = load_model(kBinPath);
  EXPECT_EQ(m.format, "llama2c");
  EXPECT_EQ(m.tensors().size(), 47u);
}

TEST(Llama2cReal, Truncated) {
  const std::string full = read_file(kBinPath);
  for (size_t n = 0; n < 28; ++n) {
    std::string msg = error_of([&] { load_bytes(full.substr(0, n)); });
    ASSERT_NE(msg.find("truncated while reading header"), std::string::npos) << "cut at " << n << ": " << msg;
  }
  for (size_t n = 28; n < full.size(); n += (n < 1024 ? 1 : 997)) {
    std::string msg = error_of([&] { load_bytes(full.substr(0, n)); });
    ASSERT_NE(msg.find("does not match the 1056540 bytes implied by the header"), std::string::npos)
        << "cut at " << n << ": " << msg;
  }
  expect_error(full.substr(0, full.size() - 1), "file size 1056539 bytes");
  expect_error(full + "x", "file size 1056541 bytes");
  // Through load_model (not GGUF, not a directory): the path is named once (trial 48: twice).
  const std::string cut = (std::filesystem::temp_directory_path() / "mk_llama2c_cut.bin").string();
  std::ofstream(cut, std::ios::binary) << full.substr(0, 1000000);
  const std::string msg = error_of([&] { load_model(cut); });
  EXPECT_EQ(msg, cut + ": not a GGUF file (no GGUF magic), a Hugging Face directory, or a valid llama2.c checkpoint: llama2.c file "
                       "size 1000000 bytes does not match the 1056540 bytes implied by the header (dim=64 hidden_dim=172 n_layers=5 "
                       "n_heads=8 n_kv_heads=4 vocab_size=512 shared classifier seq_len=512)");
  std::filesystem::remove(cut);
}

// ---------------------------------------------------------------------------------------------
// Crafted files.

TEST(Llama2cCrafted, SharedClassifierLayout) {
  Params p;
  ModelFile m = load_bytes(legacy_file(p));
  ASSERT_EQ(m.tensors().size(), 1u + 9 * 2 + 1);
  // Float values equal their index after the header, so the first value names the position.
  const int64_t d = 8, v = 10, L = 2, kv = 4, h = 12;
  EXPECT_EQ(first_float(m.get("token_embd.weight", {v, d})), 0.0f);
  EXPECT_EQ(first_float(m.get("blk.0.attn_norm.weight", {d})), v * d);
  EXPECT_EQ(first_float(m.get("blk.1.attn_norm.weight", {d})), v * d + d);
  const int64_t wq = v * d + L * d;
  EXPECT_EQ(first_float(m.get("blk.0.attn_q.weight", {d, d})), wq);
  EXPECT_EQ(first_float(m.get("blk.1.attn_q.weight", {d, d})), wq + d * d);
  const int64_t wk = wq + L * d * d;
  EXPECT_EQ(first_float(m.get("blk.1.attn_k.weight", {kv, d})), wk + kv * d);
  const int64_t wv = wk + L * kv * d;
  EXPECT_EQ(first_float(m.get("blk.0.attn_v.weight", {kv, d})), wv);
  const int64_t wo = wv + L * kv * d;
  EXPECT_EQ(first_float(m.get("blk.1.attn_output.weight", {d, d})), wo + d * d);
  const int64_t rms_ffn = wo + L * d * d;
  EXPECT_EQ(first_float(m.get("blk.1.ffn_norm.weight", {d})), rms_ffn + d);
  const int64_t w1 = rms_ffn + L * d;
  EXPECT_EQ(first_float(m.get("blk.0.ffn_gate.weight", {h, d})), w1);
  const int64_t w2 = w1 + L * h * d;
  EXPECT_EQ(first_float(m.get("blk.1.ffn_down.weight", {d, h})), w2 + d * h);
  const int64_t w3 = w2 + L * d * h;
  EXPECT_EQ(first_float(m.get("blk.1.ffn_up.weight", {h, d})), w3 + h * d);
  EXPECT_EQ(first_float(m.get("output_norm.weight", {d})), w3 + L * h * d);
  EXPECT_EQ(m.find("output.weight"), nullptr);
  EXPECT_EQ(m.get_int("llama.attention.head_count_kv"), 1);
  EXPECT_EQ(m.get_int("llama.rope.dimension_count"), 4);
  EXPECT_EQ(m.get_int("llama.context_length"), 6);
}

TEST(Llama2cCrafted, SeparateClassifier) {
  Params p;
  p.vocab_size = -10;
  std::string b = legacy_file(p);
  ModelFile m = load_bytes(b);
  EXPECT_EQ(m.get_int("llama.vocab_size"), 10);
  const auto& out = m.get("output.weight", {10, 8});
  EXPECT_EQ(m.tensors().back().name, "output.weight");
  EXPECT_EQ(out.file_offset + out.nbytes, b.size());
  // wcls comes after the freq_cis tables (seq_len * head_size floats in total).
  const auto& norm = m.get("output_norm.weight");
  EXPECT_EQ(out.file_offset, norm.file_offset + norm.nbytes + 6u * 4 * 4);
}

TEST(Llama2cCrafted, Version1) {
  Params p;
  auto build = [&](bool shared) {
    std::string s = raw<uint32_t>(0x616b3432) + raw<int32_t>(1) + header(p) + raw<uint8_t>(shared ? 1 : 0);
    s.resize(256, '\0');
    const int64_t d = p.dim, L = p.n_layers, h = p.hidden_dim, v = p.vocab_size, kv = 4;
    int64_t n = 2 * L * d + d + v * d + 2 * L * d * d + 2 * L * kv * d + 3 * L * h * d + (shared ? 0 : v * d);
    for (int64_t i = 0; i < n; ++i) s += raw(static_cast<float>(i));
    return s;
  };
  ModelFile m = load_bytes(build(true));
  EXPECT_EQ(m.tensors().size(), 20u);
  EXPECT_EQ(m.get("blk.0.attn_norm.weight").file_offset, 256u);
  EXPECT_EQ(first_float(m.get("blk.1.ffn_norm.weight")), 3 * 8.0f);
  EXPECT_EQ(first_float(m.get("output_norm.weight")), 4 * 8.0f);
  EXPECT_EQ(first_float(m.get("token_embd.weight", {10, 8})), 5 * 8.0f);
  EXPECT_EQ(first_float(m.get("blk.0.attn_q.weight", {8, 8})), 5 * 8.0f + 80);
  EXPECT_EQ(m.find("output.weight"), nullptr);

  ModelFile sep = load_bytes(build(false));
  const auto& out = sep.get("output.weight", {10, 8});
  EXPECT_EQ(out.file_offset + out.nbytes, build(false).size());

  expect_error(build(true).substr(0, 200), "truncated while reading header padding");
  std::string odd_flag = build(true);
  odd_flag[36] = 7;
  expect_error(odd_flag, "shared_classifier flag 7");
  std::string flag_lies = build(false);
  flag_lies[36] = 1;  // says shared, but the file holds a classifier
  expect_error(flag_lies, "does not match");
  std::string v2 = build(true);
  v2[4] = 2;
  expect_error(v2, "version 2 checkpoints (Q8_0 export) are not supported");
  std::string v9 = build(true);
  v9[4] = 9;
  expect_error(v9, "unsupported llama2.c checkpoint version 9");
}

// ---------------------------------------------------------------------------------------------
// Damaged files.

TEST(Llama2cDamaged, BadHeaderValues) {
  struct Case {
    Params p;
    const char* text;
  };
  std::vector<Case> cases;
  auto add = [&](auto edit, const char* text) {
    Params p;
    edit(p);
    cases.push_back({p, text});
  };
  add([](Params& p) { p.dim = 0; }, "dim = 0 must be positive");
  add([](Params& p) { p.dim = -8; }, "dim = -8 must be positive");
  add([](Params& p) { p.hidden_dim = 0; }, "hidden_dim = 0 must be positive");
  add([](Params& p) { p.n_layers = -1; }, "n_layers = -1 must be positive");
  add([](Params& p) { p.n_heads = 0; }, "n_heads = 0 must be positive");
  add([](Params& p) { p.n_kv_heads = 0; }, "n_kv_heads = 0 must be positive");
  add([](Params& p) { p.vocab_size = 0; }, "vocab_size = 0 must be positive");
  add([](Params& p) { p.vocab_size = INT32_MIN; }, "vocab_size = 2147483648 exceeds the limit");
  add([](Params& p) { p.seq_len = 0; }, "seq_len = 0 must be positive");
  add([](Params& p) { p.dim = INT32_MAX; }, "dim = 2147483647 exceeds the limit 65536");
  add([](Params& p) { p.n_layers = 100000; }, "n_layers = 100000 exceeds the limit");
  add([](Params& p) { p.seq_len = 1 << 30; }, "seq_len = 1073741824 exceeds the limit");
  add([](Params& p) { p.n_heads = 3; }, "n_heads = 3 does not divide dim = 8");
  add([](Params& p) { p.n_kv_heads = 3; p.n_heads = 4; }, "n_kv_heads = 3 does not divide n_heads = 4");
  add([](Params& p) { p.dim = 6; p.n_heads = 2; }, "head size 3 must be even");
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    expect_error(legacy_file(Params{}).replace(0, 28, header(c.p)), c.text);
    expect_error(header(c.p), c.text);  // header values are checked before the size
  }
}

TEST(Llama2cDamaged, WrongFileSize) {
  Params p;
  std::string b = legacy_file(p);
  expect_error(b.substr(0, b.size() - 4), "does not match");
  expect_error(b + std::string(4, '\0'), "does not match");
  // A shared-classifier header on a file that holds a separate classifier.
  Params sep = p;
  sep.vocab_size = -10;
  expect_error(legacy_file(sep).replace(0, 28, header(p)), "shared classifier");
  // And the reverse.
  expect_error(b.replace(0, 28, header(sep)), "separate classifier");
  // Without the freq_cis tables.
  std::string no_freq = legacy_file(p);
  no_freq.resize(no_freq.size() - 6 * 4 * 4);
  expect_error(no_freq, "does not match");
}

TEST(Llama2cDamaged, NotAModel) {
  expect_error("hello world, this is a text file and not a model checkpoint\n", "llama2.c header");
  expect_error("", "truncated while reading header dim");
}

// ---------------------------------------------------------------------------------------------
// Fuzzing: random header values must load or fail with mk::Error.

TEST(FuzzLlama2c, MutatedHeaders) {
  Params p;
  const std::string base = legacy_file(p);
  std::mt19937 rng(7);
  int loaded = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string b = base;
    int n_mut = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < n_mut; ++k) b[rng() % 28] = static_cast<char>(rng() % 4 == 0 ? rng() : rng() % 16);
    try {
      ModelFile m = load_bytes(b);
      ++loaded;
      for (const auto& t : m.tensors()) ASSERT_LE(t.file_offset + t.nbytes, b.size()) << t.name;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(loaded, 0);  // some mutations leave the header intact or equivalent
}
