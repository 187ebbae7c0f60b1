// GGUF loader tests: the real stories260K.gguf, files crafted in memory (every metadata type,
// every supported tensor type) and damaged files, each of which must fail with an mk::Error whose
// message names the problem. Fuzz* runs random mutations under the sanitizers.
#include <gtest/gtest.h>

#include "support/errors.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <unistd.h>

#include "archs/arch.h"
#include "model/model_file.h"
#include "support/error.h"
#include "support/gguf_write.h"

using namespace mk;

namespace {

const std::string kGgufPath = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";

// Minimal GGUF writer for crafting test files (GGUF v2/v3 little-endian layout).
struct GgufWriter {
  uint32_t version = 3;
  std::string kvs, infos, data;
  uint64_t n_kv = 0, n_tensors = 0;
  uint64_t alignment = 32;  // used to place data and pad the info section; set general.alignment to match
  std::optional<uint64_t> kv_count_override, tensor_count_override;

  static void u8(std::string& s, uint8_t v) { s.push_back(static_cast<char>(v)); }
  static void u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
  static void u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
  static void f32(std::string& s, float v) { s.append(reinterpret_cast<const char*>(&v), 4); }
  static void str(std::string& s, const std::string& v) {
    u64(s, v.size());
    s += v;
  }

  // A metadata pair with a raw, already encoded value.
  void kv(const std::string& key, uint32_t type, const std::string& payload) {
    str(kvs, key);
    u32(kvs, type);
    kvs += payload;
    ++n_kv;
  }
  void kv_u32(const std::string& key, uint32_t v) {
    std::string p;
    u32(p, v);
    kv(key, 4, p);
  }
  void kv_str(const std::string& key, const std::string& v) {
    std::string p;
    str(p, v);
    kv(key, 8, p);
  }

  static uint64_t type_bytes(uint32_t type, uint64_t n) {
    switch (type) {
      case 0: return 4 * n;
      case 1: case 30: return 2 * n;
      case 8: return n / 32 * 34;
      default: return n;
    }
  }
  // Tensor info only; the caller places the data.
  void tensor_info(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset) {
    str(infos, name);
    u32(infos, static_cast<uint32_t>(ne.size()));
    for (auto d : ne) u64(infos, d);
    u32(infos, type);
    u64(infos, offset);
    ++n_tensors;
  }
  // Tensor info plus data (bytes 0, 1, 2, ...) at the next aligned offset; returns the offset.
  uint64_t tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type) {
    uint64_t n = 1;
    for (auto d : ne) n *= d;
    while (data.size() % alignment) data.push_back('\0');
    uint64_t off = data.size();
    tensor_info(name, ne, type, off);
    uint64_t nbytes = type_bytes(type, n);
    for (uint64_t i = 0; i < nbytes; ++i) data.push_back(static_cast<char>(i & 0xff));
    return off;
  }

  std::string header() const {
    std::string s = "GGUF";
    u32(s, version);
    u64(s, tensor_count_override.value_or(n_tensors));
    u64(s, kv_count_override.value_or(n_kv));
    return s;
  }
  std::string build() const {
    std::string s = header() + kvs + infos;
    while (s.size() % alignment) s.push_back('\0');
    return s + data;
  }
};

// Little-endian encoding of one value, and a GGUF string.
template <class T>
std::string raw(T v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}
std::string gstr(const std::string& s) { return raw<uint64_t>(s.size()) + s; }

ModelFile load_bytes(std::string bytes) { return load_gguf(MappedFile::from_bytes(std::move(bytes), "test.gguf")); }

using test::error_of;

void expect_error(const std::string& bytes, const std::string& substring) {
  std::string msg = error_of([&] { load_bytes(bytes); });
  EXPECT_NE(msg.find(substring), std::string::npos) << "expected \"" << substring << "\" in: " << msg;
  EXPECT_NE(msg.find("test.gguf"), std::string::npos) << "error does not name the file: " << msg;
}

// A small valid file: two f32 tensors and a few metadata entries.
GgufWriter small_file() {
  GgufWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.embedding_length", 8);
  w.tensor("a.weight", {8, 2}, 0);
  w.tensor("b.weight", {8}, 0);
  return w;
}

std::string read_file(const std::string& path) {
  auto f = MappedFile::open(path);
  return std::string(reinterpret_cast<const char*>(f->data()), f->size());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The real file.

TEST(GgufReal, LoadsStories260K) {
  ModelFile m = load_gguf(kGgufPath);
  EXPECT_EQ(m.format, "gguf");
  EXPECT_EQ(m.path, kGgufPath);
  ASSERT_EQ(m.tensors().size(), 48u);
  EXPECT_EQ(m.get_str("general.architecture"), "llama");
  EXPECT_EQ(m.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(m.get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(m.get_int("llama.block_count"), 5);
  EXPECT_EQ(m.get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(m.get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(m.get_int("llama.context_length"), 2048);
  EXPECT_EQ(m.get_int("llama.rope.dimension_count"), 8);
  EXPECT_NEAR(m.get_float("llama.attention.layer_norm_rms_epsilon", 0), 1e-5, 1e-10);
  EXPECT_EQ(m.get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(m.get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(m.get_int("tokenizer.ggml.padding_token_id"), 4294967295);
  EXPECT_EQ(m.get_str("tokenizer.ggml.model"), "llama");
  const auto& tokens = m.metadata.at("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.is_array());
  ASSERT_EQ(tokens.size(), 512u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(m.metadata.at("tokenizer.ggml.scores").size(), 512u);
  EXPECT_TRUE(m.metadata.at("tokenizer.ggml.scores")[0].is_number_float());
  EXPECT_EQ(m.metadata.at("tokenizer.ggml.token_type").size(), 512u);
  EXPECT_EQ(m.metadata.at("tokenizer.ggml.token_type")[0], 2);
  EXPECT_FALSE(m.has("general.alignment"));

  // Metadata keeps the file's key order.
  EXPECT_EQ(m.metadata.begin().key(), "tokenizer.ggml.tokens");

  const auto& emb = m.get("token_embd.weight", {512, 64});
  EXPECT_EQ(emb.dtype, DType::F32);
  EXPECT_EQ(emb.nbytes, 512u * 64 * 4);
  EXPECT_EQ(emb.file_offset, 14176u);  // tensor infos end at 14152, aligned up to 32
  EXPECT_EQ(emb.data, m.files.at(0)->data() + 14176);
  m.get("output.weight", {512, 64});
  m.get("output_norm.weight", {64});
  for (int il = 0; il < 5; ++il) {
    std::string p = "blk." + std::to_string(il) + ".";
    m.get(p + "attn_norm.weight", {64});
    m.get(p + "attn_q.weight", {64, 64});
    m.get(p + "attn_k.weight", {32, 64});
    m.get(p + "attn_v.weight", {32, 64});
    m.get(p + "attn_output.weight", {64, 64});
    m.get(p + "ffn_norm.weight", {64});
    m.get(p + "ffn_gate.weight", {172, 64});
    m.get(p + "ffn_down.weight", {64, 172});
    m.get(p + "ffn_up.weight", {172, 64});
  }
  const auto& last = m.get("blk.4.ffn_norm.weight");
  EXPECT_EQ(last.file_offset + last.nbytes, m.files.at(0)->size());
  // RMSNorm weights of a trained model are positive-ish and finite; check a value is sane.
  float w0;
  std::memcpy(&w0, m.get("output_norm.weight").data, 4);
  EXPECT_TRUE(std::isfinite(w0));
  EXPECT_NE(w0, 0.0f);
}

TEST(GgufReal, LoadModelDispatchesOnMagic) {
  ModelFile m = load_model(kGgufPath);
  EXPECT_EQ(m.format, "gguf");
  EXPECT_EQ(m.tensors().size(), 48u);
}

TEST(GgufReal, TruncatedAtEveryHeaderOffset) {
  const std::string full = read_file(kGgufPath);
  const size_t data_start = 14176;
  for (size_t n = 0; n < data_start; ++n) {
    std::string msg = error_of([&] { load_bytes(full.substr(0, n)); });
    // Either the header parse runs out of bytes, or (when cut inside the padding or data) the
    // tensor data check fires.
    bool ok = msg.find("truncated") != std::string::npos || msg.find("past the end") != std::string::npos ||
              msg.find("too large for the") != std::string::npos || msg.find("exceeds the") != std::string::npos;
    ASSERT_TRUE(ok) << "cut at " << n << ": " << msg;
  }
}

TEST(GgufReal, TruncatedSweepThroughData) {
  const std::string full = read_file(kGgufPath);
  for (size_t n = 14176; n < full.size(); n += 4099) {
    std::string msg = error_of([&] { load_bytes(full.substr(0, n)); });
    ASSERT_NE(msg.find("past the end of the file"), std::string::npos) << "cut at " << n << ": " << msg;
  }
  std::string msg = error_of([&] { load_bytes(full.substr(0, full.size() - 1)); });
  EXPECT_NE(msg.find("tensor blk.4.ffn_norm.weight"), std::string::npos) << msg;
  EXPECT_EQ(load_bytes(full).tensors().size(), 48u);
}

// ---------------------------------------------------------------------------------------------
// Crafted valid files.

TEST(GgufCrafted, SmallFileLoads) {
  GgufWriter w = small_file();
  ModelFile m = load_bytes(w.build());
  ASSERT_EQ(m.tensors().size(), 2u);
  EXPECT_EQ(m.tensors()[0].name, "a.weight");
  EXPECT_EQ(m.tensors()[0].shape, (std::vector<int64_t>{2, 8}));  // ne reversed: outermost first
  EXPECT_EQ(m.tensors()[0].nbytes, 64u);
  EXPECT_EQ(m.tensors()[1].shape, (std::vector<int64_t>{8}));
  EXPECT_EQ(m.tensors()[1].file_offset - m.tensors()[0].file_offset, 64u);
  EXPECT_EQ(m.tensors()[0].file_offset % 32, 0u);
  EXPECT_EQ(m.get_int("llama.embedding_length"), 8);
}

TEST(GgufCrafted, Version2Loads) {
  GgufWriter w = small_file();
  w.version = 2;
  EXPECT_EQ(load_bytes(w.build()).tensors().size(), 2u);
}

TEST(GgufCrafted, EveryMetadataValueType) {
  GgufWriter w;
  w.kv("u8", 0, raw<uint8_t>(200));
  w.kv("i8", 1, raw<int8_t>(-5));
  w.kv("u16", 2, raw<uint16_t>(0x1234));
  w.kv("i16", 3, raw<int16_t>(-2));
  w.kv("u32", 4, raw<uint32_t>(4000000000u));
  w.kv("i32", 5, raw<int32_t>(-7));
  w.kv("f32", 6, raw<float>(0.5f));
  w.kv("bool", 7, raw<uint8_t>(1));
  w.kv("str", 8, gstr("hello"));
  w.kv("u64", 10, raw<uint64_t>(18000000000000000000ull));
  w.kv("i64", 11, raw<int64_t>(-9));
  w.kv("f64", 12, raw<double>(2.25));
  w.kv("arr_i32", 9, raw<uint32_t>(5) + raw<uint64_t>(3) + raw<int32_t>(1) + raw<int32_t>(-2) + raw<int32_t>(3));
  w.kv("arr_str", 9, raw<uint32_t>(8) + raw<uint64_t>(2) + gstr("x") + gstr(""));
  // [[true], []]: an array of arrays of bool.
  w.kv("arr_nested", 9,
       raw<uint32_t>(9) + raw<uint64_t>(2) + raw<uint32_t>(7) + raw<uint64_t>(1) + raw<uint8_t>(1) + raw<uint32_t>(7) +
           raw<uint64_t>(0));
  w.kv("arr_empty", 9, raw<uint32_t>(12) + raw<uint64_t>(0));

  ModelFile m = load_bytes(w.build());
  const auto& md = m.metadata;
  EXPECT_EQ(md.at("u8"), 200);
  EXPECT_EQ(md.at("i8"), -5);
  EXPECT_EQ(md.at("u16"), 0x1234);
  EXPECT_EQ(md.at("i16"), -2);
  EXPECT_EQ(md.at("u32"), 4000000000u);
  EXPECT_EQ(md.at("i32"), -7);
  EXPECT_EQ(md.at("f32"), 0.5);
  EXPECT_EQ(md.at("bool"), true);
  EXPECT_EQ(md.at("str"), "hello");
  EXPECT_EQ(md.at("u64").get<uint64_t>(), 18000000000000000000ull);
  EXPECT_EQ(md.at("i64"), -9);
  EXPECT_EQ(md.at("f64"), 2.25);
  EXPECT_EQ(md.at("arr_i32").dump(), "[1,-2,3]");
  EXPECT_EQ(md.at("arr_str").dump(), "[\"x\",\"\"]");
  EXPECT_EQ(md.at("arr_nested").dump(), "[[true],[]]");
  EXPECT_EQ(md.at("arr_empty").dump(), "[]");
  EXPECT_EQ(m.tensors().size(), 0u);
}

TEST(GgufCrafted, SupportedTensorTypes) {
  GgufWriter w;
  w.tensor("f32", {4, 3}, 0);
  w.tensor("f16", {4, 3}, 1);
  w.tensor("q8_0", {64, 2}, 8);
  w.tensor("bf16", {6}, 30);
  w.tensor("four_dims", {2, 3, 4, 5}, 0);
  ModelFile m = load_bytes(w.build());
  EXPECT_EQ(m.get("f32").dtype, DType::F32);
  EXPECT_EQ(m.get("f32").nbytes, 48u);
  EXPECT_EQ(m.get("f16").dtype, DType::F16);
  EXPECT_EQ(m.get("f16").nbytes, 24u);
  EXPECT_EQ(m.get("q8_0").dtype, DType::Q8_0);
  EXPECT_EQ(m.get("q8_0").nbytes, 4u * 34);
  EXPECT_EQ(m.get("q8_0").shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(m.get("bf16").dtype, DType::BF16);
  EXPECT_EQ(m.get("bf16").nbytes, 12u);
  EXPECT_EQ(m.get("four_dims").shape, (std::vector<int64_t>{5, 4, 3, 2}));
}

TEST(GgufCrafted, CustomAlignment) {
  GgufWriter w;
  w.alignment = 64;
  w.kv_u32("general.alignment", 64);
  w.tensor("a", {3}, 0);
  w.tensor("b", {3}, 0);
  ModelFile m = load_bytes(w.build());
  EXPECT_EQ(m.get("a").file_offset % 64, 0u);
  EXPECT_EQ(m.get("b").file_offset - m.get("a").file_offset, 64u);
}

TEST(GgufCrafted, NoTensorsNoPadding) {
  GgufWriter w;
  w.kv_str("general.name", "x");
  std::string bytes = w.header() + w.kvs;  // ends unaligned, no data section at all
  EXPECT_EQ(load_bytes(bytes).get_str("general.name"), "x");
}

// ---------------------------------------------------------------------------------------------
// Damaged files.

TEST(GgufDamaged, WrongMagic) {
  std::string b = small_file().build();
  b[0] = 'g';
  expect_error(b, "bad magic");
}

TEST(GgufDamaged, UnsupportedVersions) {
  GgufWriter w = small_file();
  w.version = 1;
  expect_error(w.build(), "unsupported GGUF version 1");
  w.version = 4;
  expect_error(w.build(), "unsupported GGUF version 4");
  w.version = 0;
  expect_error(w.build(), "unsupported GGUF version 0");
  w.version = 0x03000000;
  expect_error(w.build(), "big-endian");
}

TEST(GgufDamaged, HugeCounts) {
  GgufWriter w = small_file();
  w.kv_count_override = 1ull << 60;
  expect_error(w.build(), "metadata kv count 1152921504606846976 at offset 16 is too large");
  w.kv_count_override = ~0ull;
  expect_error(w.build(), "metadata kv count");
  w.kv_count_override.reset();
  w.tensor_count_override = 1ull << 40;
  expect_error(w.build(), "tensor count 1099511627776 at offset 8 is too large");
  w.tensor_count_override = ~0ull;
  expect_error(w.build(), "tensor count");
  // Plausible count but more entries than the file holds.
  w.tensor_count_override = 3;
  std::string msg = error_of([&] { load_bytes(w.build()); });
  EXPECT_NE(msg.find("test.gguf"), std::string::npos) << msg;
}

TEST(GgufDamaged, HugeStringLengths) {
  GgufWriter w;
  GgufWriter::u64(w.kvs, 1ull << 62);  // key length
  w.kvs += std::string(40, 'k');
  w.n_kv = 1;
  expect_error(w.build(), "string length 4611686018427387904 exceeds");

  GgufWriter v;
  v.kv("general.name", 8, raw<uint64_t>(~0ull) + "abc");  // string value length
  expect_error(v.build(), "metadata general.name at offset 48: string length 18446744073709551615 exceeds");

  GgufWriter t;
  GgufWriter::u64(t.infos, 1ull << 50);  // tensor name length
  t.infos += std::string(40, 'x');
  t.n_tensors = 1;
  expect_error(t.build(), "name of tensor info 0");
}

TEST(GgufDamaged, HugeArrayLengths) {
  for (uint32_t et : {0u, 4u, 8u, 9u, 12u}) {
    SCOPED_TRACE(et);
    GgufWriter w;
    w.kv("tokenizer.ggml.tokens", 9, raw<uint32_t>(et) + raw<uint64_t>(1ull << 61) + std::string(64, '\0'));
    expect_error(w.build(), "metadata tokenizer.ggml.tokens at offset 57: array length 2305843009213693952");
  }
}

TEST(GgufDamaged, DeeplyNestedArrays) {
  GgufWriter w;
  std::string p;
  for (int i = 0; i < 40; ++i) p += raw<uint32_t>(9) + raw<uint64_t>(1);
  w.kv("deep", 9, p);
  expect_error(w.build(), "nested more than 16 deep");
}

TEST(GgufDamaged, BadMetadataValues) {
  {
    GgufWriter w;
    w.kv("flag", 7, std::string(1, '\x02'));
    expect_error(w.build(), "bool value 2 is neither 0 nor 1");
  }
  {
    GgufWriter w;
    w.kv("weird", 13, std::string(8, '\0'));
    expect_error(w.build(), "metadata weird at offset 24: unknown value type 13");
  }
  {
    GgufWriter w;
    w.kv("arr", 9, raw<uint32_t>(99) + raw<uint64_t>(1));
    expect_error(w.build(), "unknown array element type 99");
  }
  {
    GgufWriter w;
    w.kv_u32("a", 1);
    w.kv_u32("a", 2);
    expect_error(w.build(), "duplicate metadata key a");
  }
  {
    GgufWriter w;
    w.kv_u32("", 1);
    expect_error(w.build(), "empty key");
  }
}

// A damaged key or tensor name is echoed with its control and non-UTF-8 bytes escaped (\xNN), so
// the error never writes raw bytes to the terminal; valid UTF-8 stays readable.
TEST(GgufDamaged, NonPrintableKeyAndNameBytesAreEscaped) {
  {
    GgufWriter w;
    w.kv(std::string("gen\x01ral.\xffname\x1b[2J"), 13, std::string(8, '\0'));
    const std::string msg = error_of([&] { load_bytes(w.build()); });
    EXPECT_NE(msg.find("metadata gen\\x01ral.\\xffname\\x1b[2J at offset 24: unknown value type 13"), std::string::npos) << msg;
    for (char c : msg) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "raw byte " << int(static_cast<unsigned char>(c)) << " in: " << msg;
  }
  {
    GgufWriter w;
    w.kv_u32("caf\xc3\xa9\xc3", 1);  // "café" then a cut sequence
    w.kv_u32("caf\xc3\xa9\xc3", 2);
    expect_error(w.build(), "duplicate metadata key caf\xc3\xa9\\xc3 at offset");
  }
  {
    GgufWriter w;
    w.tensor(std::string("blk.0\x00\x07", 7), {8}, 0);
    w.tensor(std::string("blk.0\x00\x07", 7), {8}, 0);
    expect_error(w.build(), "duplicate tensor name blk.0\\x00\\x07");
  }
}

TEST(GgufDamaged, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufWriter w = small_file();
    w.kv_u32("general.alignment", a);
    expect_error(w.build(), "general.alignment " + std::to_string(a) + " must be a nonzero power of two");
  }
  GgufWriter w = small_file();
  w.kv_str("general.alignment", "32");
  expect_error(w.build(), "general.alignment must be an integer");
  GgufWriter n = small_file();
  n.kv("general.alignment", 5, raw<int32_t>(-32));
  expect_error(n.build(), "general.alignment -32 must be a nonzero power of two");
}

TEST(GgufDamaged, TensorDataPastEnd) {
  GgufWriter w = small_file();
  std::string b = w.build();
  expect_error(b.substr(0, b.size() - 1), "tensor b.weight");
  expect_error(b.substr(0, b.size() - 1), "lies past the end of the file");
  GgufWriter far;
  far.tensor_info("x", {4}, 0, 1ull << 62);
  far.data = std::string(64, '\0');
  expect_error(far.build(), "tensor x (info at offset 24): data at offset");
  GgufWriter wrap;  // offset + size would wrap around 2^64
  wrap.tensor_info("x", {4}, 0, ~0ull - 31);
  wrap.data = std::string(64, '\0');
  expect_error(wrap.build(), "lies past the end of the file");
}

TEST(GgufDamaged, DataSectionPastEnd) {
  GgufWriter w;
  w.tensor_info("x", {1}, 0, 0);
  std::string b = w.header() + w.infos;  // no padding, no data
  ASSERT_NE(b.size() % 32, 0u);
  expect_error(b, "data section would start at offset");
}

TEST(GgufDamaged, OverlappingTensors) {
  GgufWriter w;
  w.tensor_info("first", {16}, 0, 0);
  w.tensor_info("second", {16}, 0, 32);  // first covers [0, 64)
  w.data = std::string(128, '\0');
  expect_error(w.build(), "tensors first (offset 128, 64 bytes) and second (offset 160) overlap");
  GgufWriter same;
  same.tensor_info("a", {8}, 0, 0);
  same.tensor_info("b", {8}, 0, 0);
  same.data = std::string(32, '\0');
  expect_error(same.build(), "overlap");
}

TEST(GgufDamaged, MisalignedOffset) {
  GgufWriter w;
  w.tensor_info("x", {4}, 0, 4);
  w.data = std::string(64, '\0');
  expect_error(w.build(), "tensor x (info at offset 24): data offset 4 is not a multiple of the alignment 32");
  GgufWriter a;
  a.alignment = 64;
  a.kv_u32("general.alignment", 64);
  a.tensor_info("y", {4}, 0, 32);
  a.data = std::string(128, '\0');
  expect_error(a.build(), "data offset 32 is not a multiple of the alignment 64");
}

TEST(GgufDamaged, UnsupportedTensorTypes) {
  struct Case {
    uint32_t type;
    const char* text;
  } cases[] = {{16, "iq2_xxs (16)"}, {9, "q8_1 (9)"}, {15, "q8_K (15)"}, {28, "f64 (28)"}, {4, "q4_2 (removed) (4)"},
               {39, "mxfp4 (39)"}, {1000, "unknown ggml type (1000)"}};
  for (const auto& c : cases) {
    GgufWriter w;
    w.tensor_info("blk.0.attn_q.weight", {32}, c.type, 0);
    w.data = std::string(256, '\0');
    expect_error(w.build(), std::string("tensor blk.0.attn_q.weight at offset 24: unsupported tensor type ") + c.text);
  }
}

TEST(GgufDamaged, BadDimensions) {
  GgufWriter five;
  five.tensor_info("x", {1, 1, 1, 1, 1}, 0, 0);
  five.data = std::string(32, '\0');
  expect_error(five.build(), "tensor x at offset 24: 5 dimensions (1 to 4 supported)");
  GgufWriter zero_dims;
  zero_dims.tensor_info("x", {}, 0, 0);
  zero_dims.data = std::string(32, '\0');
  expect_error(zero_dims.build(), "0 dimensions");
  GgufWriter huge_dims;
  huge_dims.tensor_info("x", {1}, 0, 0);
  huge_dims.infos[8 + 1] = '\xff';  // n_dims low byte -> 255
  expect_error(huge_dims.build(), "255 dimensions");
  GgufWriter zero;
  zero.tensor_info("x", {4, 0}, 0, 0);
  zero.data = std::string(32, '\0');
  expect_error(zero.build(), "dimension 1 is zero");
}

TEST(GgufDamaged, ElementCountOverflow) {
  GgufWriter w;
  w.tensor_info("x", {1ull << 32, 1ull << 32, 16}, 0, 0);
  w.data = std::string(32, '\0');
  expect_error(w.build(), "element count overflows");
  GgufWriter big;  // no overflow, but more elements than the file has bytes
  big.tensor_info("x", {1ull << 20, 1ull << 20}, 0, 0);
  big.data = std::string(32, '\0');
  expect_error(big.build(), "tensor x (info at offset 24): data at offset 96 + 4398046511104 bytes lies past the end");
}

TEST(GgufDamaged, Q8_0RowsNotWholeBlocks) {
  GgufWriter w;
  w.tensor_info("q", {48, 2}, 8, 0);  // ne[0] = 48 is not a multiple of 32
  w.data = std::string(256, '\0');
  expect_error(w.build(), "tensor q at offset 24: q8_0 rows of 48 elements are not a whole number of blocks of 32");
}

TEST(GgufDamaged, DuplicateTensorNames) {
  GgufWriter w;
  w.tensor("x", {8}, 0);
  w.tensor("x", {8}, 0);
  expect_error(w.build(), "duplicate tensor name x");
}

TEST(GgufDamaged, EmptyTensorName) {
  GgufWriter w;
  w.tensor("", {8}, 0);
  expect_error(w.build(), "tensor info 0 at offset 24 has an empty name");
}

TEST(GgufDamaged, TruncatedSmallFileAtEveryOffset) {
  GgufWriter w = small_file();
  std::string b = w.build();
  for (size_t n = 0; n < b.size(); ++n) {
    std::string msg = error_of([&] { load_bytes(b.substr(0, n)); });
    bool ok = msg.find("truncated while reading") != std::string::npos ||
              msg.find("past the end of the file") != std::string::npos ||
              msg.find("too large for the") != std::string::npos || msg.find("exceeds the") != std::string::npos;
    ASSERT_TRUE(ok) << "cut at " << n << ": " << msg;
  }
  EXPECT_NE(error_of([&] { load_bytes(b.substr(0, 6)); }).find("truncated while reading version at offset 4"),
            std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// load_model dispatch errors.

TEST(GgufLoadModel, MissingFileAndDirectory) {
  std::string msg = error_of([] { load_model("/nonexistent/model.gguf"); });
  EXPECT_NE(msg.find("/nonexistent/model.gguf: no such file or directory"), std::string::npos) << msg;
  std::string dir = std::string(MK_SHARED_DIR) + "/models/stories260K";
  msg = error_of([&] { load_model(dir); });
  // A directory is read as a Hugging Face model directory, which needs a config.json.
  EXPECT_NE(msg.find("stories260K: missing config.json"), std::string::npos) << msg;
  msg = error_of([] { load_gguf(std::string("/nonexistent/x.gguf")); });
  EXPECT_NE(msg.find("/nonexistent/x.gguf"), std::string::npos) << msg;
}

// A block_count below the file's layers would drop layers silently (llama.cpp refuses such a
// file): the first tensor of a layer past the count is named, with the count and its key.
TEST(GgufLoadModel, LayerCountBelowTheFilesLayersIsRefused) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("mk_test_block_count_" + std::to_string(::getpid()) + ".gguf")).string();
  for (int n_layer : {1, 3}) {
    ModelFile m = load_model(kGgufPath);  // 5 layers
    m.metadata["llama.block_count"] = n_layer;
    test::write_gguf(m, path);
    const ModelFile lowered = load_model(path);
    const std::string msg = error_of([&] { build_graph(lowered, {}); });
    EXPECT_NE(msg.find(fmt::format("tensor blk.{}.", n_layer)), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("belongs to layer {}, but the layer count is {} (llama.block_count = {})", n_layer,
                                   n_layer, n_layer)),
              std::string::npos)
        << msg;
  }
  std::filesystem::remove(path);
  EXPECT_NO_THROW(build_graph(load_model(kGgufPath), {}));  // the true count builds
}

// ---------------------------------------------------------------------------------------------
// Fuzzing: random byte mutations must load or fail with mk::Error, never crash (ASan/UBSan run
// these). A successful load must still point every tensor inside its file.

namespace {
void load_or_error(const std::string& bytes) {
  try {
    ModelFile m = load_bytes(bytes);
    for (const auto& t : m.tensors()) {
      ASSERT_GE(t.file_offset, 0u);
      ASSERT_LE(t.file_offset + t.nbytes, bytes.size()) << t.name;
      ASSERT_EQ(t.data, m.files.at(0)->data() + t.file_offset);
    }
  } catch (const Error&) {
  }
}
}  // namespace

TEST(FuzzGguf, MutatedSmallFile) {
  GgufWriter w = small_file();
  w.kv("tokens", 9, raw<uint32_t>(8) + raw<uint64_t>(2) + gstr("ab") + gstr("c"));
  w.tensor("q", {32}, 8);
  const std::string base = w.build();
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 20000; ++iter) {
    std::string b = base;
    int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n_mut; ++k) {
      size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[at] = static_cast<char>(rng()); break;
        case 1: b[at] ^= static_cast<char>(1u << (rng() % 8)); break;
        case 2: b[at] = static_cast<char>(rng() % 2 ? 0xff : 0x00); break;
      }
    }
    if (rng() % 8 == 0) b.resize(rng() % b.size());
    load_or_error(b);
    if (HasFatalFailure()) return;
  }
}

TEST(FuzzGguf, MutatedRealHeader) {
  std::string full = read_file(kGgufPath);
  std::mt19937 rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    std::string b = full;
    for (int k = 0; k < 3; ++k) b[rng() % 14176] = static_cast<char>(rng());
    load_or_error(b);
    if (HasFatalFailure()) return;
  }
}
