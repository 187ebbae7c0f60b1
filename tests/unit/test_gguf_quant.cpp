// GGUF files with quantized tensors: every type loads, a Q4_K_M-style mix of types per tensor loads
// with the bytes it was written with, `info` shows per-type byte counts, and damaged quantized
// files (rows not whole blocks, truncated data, NaN/inf scales, unknown types) are clear errors.
// Suite names start with Gguf: they run in the ASan group.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include "model/model_file.h"
#include "quant/quant.h"
#include "support/errors.h"
#include "support/gguf_write.h"
#include "support/cli.h"

using namespace mk;

namespace {

// A model file in memory: metadata plus one tensor per (name, type, shape), random weights.
struct Spec {
  std::string name;
  DType type;
  std::vector<int64_t> shape;
};

ModelFile make_file(const std::vector<Spec>& specs) {
  ModelFile m;
  m.path = "made";
  m.format = "gguf";
  m.metadata["general.architecture"] = "llama";
  m.metadata["general.name"] = "quant test";
  m.metadata["llama.embedding_length"] = 256;  // enough llama metadata for `info`
  m.metadata["llama.block_count"] = 1;
  m.metadata["llama.attention.head_count"] = 4;
  m.metadata["llama.feed_forward_length"] = 256;
  m.metadata["llama.context_length"] = 64;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  for (const Spec& s : specs) {
    WeightTensor t;
    t.name = s.name;
    t.shape = s.shape;
    std::vector<float> f(static_cast<size_t>(t.numel()));
    for (auto& v : f) v = nd(rng);
    auto buf = std::make_shared<std::vector<uint8_t>>();
    if (const quant::QuantType* q = quant::quant_type(s.type)) {
      buf->resize(dtype_bytes(s.type, t.numel()));
      q->quantize_row(f.data(), buf->data(), t.numel());
    } else {
      buf->resize(f.size() * 4);
      std::memcpy(buf->data(), f.data(), buf->size());
    }
    t.dtype = s.type;
    t.data = buf->data();
    t.nbytes = buf->size();
    m.owned.push_back(buf);
    m.add_tensor(t);
  }
  return m;
}

ModelFile load_bytes(std::string bytes) { return load_gguf(MappedFile::from_bytes(std::move(bytes), "test.gguf")); }

void expect_error(const std::string& bytes, const std::string& substring) {
  const std::string msg = test::error_of([&] { load_bytes(bytes); });
  EXPECT_NE(msg.find(substring), std::string::npos) << "expected \"" << substring << "\" in: " << msg;
  EXPECT_NE(msg.find("test.gguf"), std::string::npos) << "error does not name the file: " << msg;
}

// Offset of tensor `name`'s data in the file bytes.
size_t data_offset(const std::string& bytes, const std::string& name) {
  return static_cast<size_t>(load_bytes(bytes).get(name).file_offset);
}

}  // namespace

TEST(GgufQuantTypes, EveryTypeLoadsWithItsBytes) {
  std::vector<Spec> specs;
  for (const quant::QuantType* q : quant::quant_types())
    specs.push_back({std::string("w.") + std::string(q->name), q->dtype, {3, 2 * q->block_size}});
  const ModelFile m = make_file(specs);
  const ModelFile back = load_bytes(test::gguf_bytes(m));
  for (const quant::QuantType* q : quant::quant_types()) {
    const std::string name = std::string("w.") + std::string(q->name);
    const WeightTensor& t = back.get(name);
    EXPECT_EQ(t.dtype, q->dtype) << name;
    EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 2 * q->block_size}));
    EXPECT_EQ(t.nbytes, static_cast<size_t>(6 * q->block_bytes)) << name;
    EXPECT_EQ(std::memcmp(t.data, m.get(name).data, t.nbytes), 0) << name;
  }
}

TEST(GgufQuantTypes, MixedTypesPerTensorLoad) {
  // What a Q4_K_M file mixes: q4_K and q6_K matrices, q5_0 / q8_0 where rows are not 256-aligned, f32 norms.
  const ModelFile m = make_file({{"token_embd.weight", DType::Q4_K, {8, 256}},
                                 {"blk.0.attn_norm.weight", DType::F32, {256}},
                                 {"blk.0.attn_q.weight", DType::Q4_K, {256, 256}},
                                 {"blk.0.attn_v.weight", DType::Q6_K, {64, 256}},
                                 {"blk.0.ffn_down.weight", DType::Q5_0, {256, 96}},
                                 {"blk.0.ffn_up.weight", DType::Q8_0, {96, 256}},
                                 {"output.weight", DType::Q6_K, {8, 256}}});
  const ModelFile back = load_bytes(test::gguf_bytes(m));
  ASSERT_EQ(back.tensors().size(), m.tensors().size());
  for (const WeightTensor& t : m.tensors()) {
    const WeightTensor& b = back.get(t.name);
    EXPECT_EQ(b.dtype, t.dtype) << t.name;
    EXPECT_EQ(b.shape, t.shape) << t.name;
    ASSERT_EQ(b.nbytes, t.nbytes) << t.name;
    std::vector<float> x(static_cast<size_t>(t.numel())), y(x.size());
    to_f32(t.dtype, t.data, x.data(), t.numel());
    to_f32(b.dtype, b.data, y.data(), b.numel());
    EXPECT_EQ(x, y) << t.name;
  }
}

TEST(GgufQuantDamaged, RowsNotWholeBlocks) {
  const ModelFile ok = make_file({{"q", DType::Q4_K, {2, 256}}, {"r", DType::Q5_0, {2, 32}}});
  std::string bytes = test::gguf_bytes(ok);
  // Rewrite ne[0] in the tensor infos: 256 -> 128 for q4_K, 32 -> 48 for q5_0.
  auto patch = [&](uint64_t from, uint64_t to, size_t after) {
    for (size_t i = after; i + 8 <= bytes.size(); ++i)
      if (std::memcmp(bytes.data() + i, &from, 8) == 0) {
        std::string s = bytes;
        std::memcpy(s.data() + i, &to, 8);
        return s;
      }
    ADD_FAILURE() << "no " << from << " in the file";
    return bytes;
  };
  const size_t infos = bytes.find(std::string("\x01\x00\x00\x00\x00\x00\x00\x00q", 9));
  ASSERT_NE(infos, std::string::npos);
  expect_error(patch(256, 128, infos), "tensor q at offset");
  expect_error(patch(256, 128, infos), "q4_K rows of 128 elements are not a whole number of blocks of 256");
  expect_error(patch(32, 48, infos), "tensor r at offset");
  expect_error(patch(32, 48, infos), "q5_0 rows of 48 elements are not a whole number of blocks of 32");
}

TEST(GgufQuantDamaged, TruncatedData) {
  const ModelFile m = make_file({{"a", DType::Q6_K, {2, 256}}, {"b", DType::Q4_1, {4, 64}}});
  const std::string bytes = test::gguf_bytes(m);
  const size_t b_at = data_offset(bytes, "b");
  // Cut inside b's last block, and inside a (then b lies past the end too).
  expect_error(bytes.substr(0, bytes.size() - 5), "tensor b (info at offset");
  expect_error(bytes.substr(0, bytes.size() - 5), "lies past the end of the file");
  expect_error(bytes.substr(0, b_at - 100), "lies past the end of the file");
}

TEST(GgufQuantDamaged, NonFiniteScales) {
  struct Case {
    DType t;
    int scale_offset;  // of an f16 scale within a block
  } cases[] = {{DType::Q4_0, 0}, {DType::Q4_1, 2}, {DType::Q5_0, 0}, {DType::Q5_1, 2}, {DType::Q8_0, 0},
               {DType::Q2_K, 82}, {DType::Q3_K, 108}, {DType::Q4_K, 2}, {DType::Q5_K, 0}, {DType::Q6_K, 208}};
  for (const Case& c : cases) {
    const quant::QuantType* q = quant::quant_type(c.t);
    const ModelFile m = make_file({{"blk.0.attn_k.weight", c.t, {2, 2 * q->block_size}}});
    const std::string bytes = test::gguf_bytes(m);
    const size_t at = data_offset(bytes, "blk.0.attn_k.weight") + 3 * static_cast<size_t>(q->block_bytes) +
                      static_cast<size_t>(c.scale_offset);
    for (uint16_t h : {uint16_t{0x7e00}, uint16_t{0x7c00}, uint16_t{0xfc00}}) {
      std::string bad = bytes;
      std::memcpy(bad.data() + at, &h, 2);
      expect_error(bad, fmt::format("tensor blk.0.attn_k.weight ({}): block 3 of 4 (file offset {}) has a non-finite scale",
                                    q->name, at - static_cast<size_t>(c.scale_offset)));
    }
  }
}

TEST(GgufQuantDamaged, UnknownTypesStayErrors) {
  const ModelFile m = make_file({{"x", DType::Q8_0, {1, 32}}});
  const std::string bytes = test::gguf_bytes(m);
  const size_t name_at = bytes.find(std::string("\x01\x00\x00\x00\x00\x00\x00\x00x", 9));
  ASSERT_NE(name_at, std::string::npos);
  const size_t type_at = name_at + 9 + 4 + 2 * 8;  // name, n_dims, ne[0], ne[1]
  for (auto [id, text] : std::vector<std::pair<uint32_t, std::string>>{
           {16, "iq2_xxs (16)"}, {9, "q8_1 (9)"}, {15, "q8_K (15)"}, {1000, "unknown ggml type (1000)"}}) {
    std::string bad = bytes;
    std::memcpy(bad.data() + type_at, &id, 4);
    expect_error(bad, "tensor x at offset");
    expect_error(bad, "unsupported tensor type " + text + " (supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, "
                      "q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs)");
  }
}

// A file with a type this loader does not read (an IQ3_S file's iq3_s tensors) is listed with the
// types as ggml names them before the refusal (new-user trials 38, 39: info printed only the error).
TEST(GgufQuantCli, InfoListsAFileWithAnUnsupportedType) {
  const ModelFile m = make_file({{"token_embd.weight", DType::Q8_0, {8, 256}}, {"blk.0.attn_q.weight", DType::Q8_0, {256, 256}}});
  std::string bytes = test::gguf_bytes(m);
  const std::string name = "blk.0.attn_q.weight";
  const size_t name_at = bytes.find(name);
  ASSERT_NE(name_at, std::string::npos);
  const uint32_t iq3_s = 21;
  std::memcpy(bytes.data() + name_at + name.size() + 4 + 2 * 8, &iq3_s, 4);  // name, n_dims, ne[0], ne[1]
  const std::string path = (std::filesystem::temp_directory_path() / "mk_quant_info_iq3s.gguf").string();
  std::ofstream(path, std::ios::binary) << bytes;
  int status = 0;
  const std::string out = test::run_cli("info -m " + path, &status);
  std::filesystem::remove(path);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("model:        " + path + " (gguf)\n"), std::string::npos) << out;
  EXPECT_NE(out.find("2 tensors:\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  blk.0.attn_q.weight                      iq3_s  [256, 256]           (type not supported)\n"),
            std::string::npos) << out;
  EXPECT_NE(out.find("  token_embd.weight                        q8_0   [8, 256]             2176 bytes\n"), std::string::npos)
      << out;
  EXPECT_NE(out.find("  iq3_s  1 tensor (not supported)\n"), std::string::npos) << out;
  EXPECT_NE(out.find("error: " + path + ": tensor blk.0.attn_q.weight at offset"), std::string::npos) << out;
  EXPECT_NE(out.find("unsupported tensor type iq3_s (21)"), std::string::npos) << out;
  EXPECT_NE(out.find("(the model cannot be run; its tensors are listed above)"), std::string::npos) << out;
}

TEST(GgufQuantCli, InfoShowsBytesPerType) {
  const ModelFile m = make_file({{"token_embd.weight", DType::Q4_K, {8, 256}},
                                 {"blk.0.attn_norm.weight", DType::F32, {256}},
                                 {"blk.0.attn_q.weight", DType::Q4_K, {256, 256}},
                                 {"blk.0.ffn_down.weight", DType::Q6_K, {16, 256}}});
  const std::string path = (std::filesystem::temp_directory_path() / "mk_quant_info.gguf").string();
  test::write_gguf(m, path);
  int status = 0;
  const std::string out = test::run_cli("info -m " + path, &status);
  std::filesystem::remove(path);
  // The listing, then the reason the model cannot run on stderr, exit 1 (as run would).
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("\nerror: " + path + ": missing tensor blk.0.attn_k.weight (the model cannot be run; its tensors are listed above)\n"),
            std::string::npos) << out;
  // q4_K: 8*256 + 256*256 elements in (8 + 256) rows of one 144-byte block per 256.
  EXPECT_NE(out.find("q4_K  2 tensors, 67584 elements, 38016 bytes (4.50 bits per weight)"), std::string::npos) << out;
  EXPECT_NE(out.find("q6_K  1 tensor, 4096 elements, 3360 bytes (6.56 bits per weight)"), std::string::npos) << out;
  EXPECT_NE(out.find("f32   1 tensor, 256 elements, 1024 bytes (32.00 bits per weight)"), std::string::npos) << out;
  EXPECT_NE(out.find("blk.0.attn_q.weight"), std::string::npos) << out;
  // A file whose graph cannot be built (k, v, o ... are missing) still lists its tensors, and says why.
  EXPECT_NE(out.find("\ngraph:        cannot be built: " + path + ": missing tensor blk.0.attn_k.weight\n"), std::string::npos) << out;
}
