// Safetensors reader: the fixture checkpoints load, bf16 fixtures are the f32 ones rounded, and
// damaged files (built in memory) fail with mk::Error naming the problem.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/hf.h"
#include "model/safetensors.h"
#include "support/error.h"

namespace mk {
namespace {

namespace fs = std::filesystem;
const fs::path kHfFixtures = fs::path(MK_SHARED_DIR) / "fixtures" / "hf";

// Bytes of a safetensors file: u64 little-endian header length, the header, the data.
std::string make_safetensors(const nlohmann::json& header, const std::string& data) {
  std::string h = header.dump();
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + data;
}

ModelFile load_bytes(const std::string& bytes, const std::string& name = "t.safetensors") {
  ModelFile m;
  m.path = name;
  add_safetensors(m, MappedFile::from_bytes(bytes, name));
  return m;
}

// Expects load_bytes to throw mk::Error whose message contains every substring in `parts`.
void expect_error(const std::string& bytes, std::initializer_list<std::string> parts) {
  try {
    load_bytes(bytes);
    ADD_FAILURE() << "no error; expected one containing " << *parts.begin();
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

TEST(Safetensors, ReadsTensorsAndMetadata) {
  nlohmann::json h = {{"__metadata__", {{"format", "pt"}}},
                      {"b", {{"dtype", "BF16"}, {"shape", {2}}, {"data_offsets", {8, 12}}}},
                      {"a", {{"dtype", "F32"}, {"shape", {1, 2}}, {"data_offsets", {0, 8}}}},
                      {"empty", {{"dtype", "F16"}, {"shape", {0, 3}}, {"data_offsets", {12, 12}}}}};
  std::string data = floats({1.5f, -2.0f});
  uint16_t bf[2] = {f32_to_bf16(3.0f), f32_to_bf16(0.25f)};
  data.append(reinterpret_cast<const char*>(bf), 4);
  std::string bytes = make_safetensors(h, data);
  ModelFile m;
  m.path = "mem";
  SafetensorsInfo info = add_safetensors(m, MappedFile::from_bytes(bytes, "mem"));
  EXPECT_EQ(info.n_tensors, 3u);
  EXPECT_EQ(info.metadata.at("format"), "pt");
  ASSERT_EQ(m.tensors().size(), 3u);
  EXPECT_EQ(m.tensors()[0].name, "a");  // file order
  const WeightTensor& a = m.get("a", {1, 2});
  EXPECT_EQ(a.dtype, DType::F32);
  float av[2];
  to_f32(a.dtype, a.data, av, 2);
  EXPECT_EQ(av[0], 1.5f);
  EXPECT_EQ(av[1], -2.0f);
  EXPECT_EQ(a.file_offset, bytes.size() - data.size());  // data section starts after the header
  const WeightTensor& b = m.get("b", {2});
  EXPECT_EQ(b.dtype, DType::BF16);
  float bv[2];
  to_f32(b.dtype, b.data, bv, 2);
  EXPECT_EQ(bv[0], 3.0f);
  EXPECT_EQ(bv[1], 0.25f);
  EXPECT_EQ(m.get("empty").nbytes, 0u);
  EXPECT_EQ(m.files.size(), 1u);
}

TEST(Safetensors, RejectsTinyFile) { expect_error(std::string(5, '\0'), {"t.safetensors", "too small"}); }

TEST(Safetensors, RejectsHeaderLengthPastEnd) {
  std::string bytes = make_safetensors({{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}}, floats({1}));
  bytes[0] = static_cast<char>(0xff);  // header length now far larger than the file
  bytes[1] = static_cast<char>(0xff);
  expect_error(bytes, {"t.safetensors", "header length", "past the end"});
  bytes[7] = static_cast<char>(0xff);  // and near 2^64: must not overflow
  expect_error(bytes, {"past the end"});
}

TEST(Safetensors, RejectsInvalidHeaderJson) {
  std::string bytes = make_safetensors({{"a", 1}}, "");
  bytes[8] = '[';
  bytes[9] = '{';
  expect_error(bytes, {"t.safetensors", "header does not start with '{'"});
  expect_error(make_safetensors(nlohmann::json::array({1, 2}), ""), {"header does not start with '{'"});
  bytes[8] = '{';
  expect_error(bytes, {"t.safetensors", "safetensors header: invalid JSON"});
}

TEST(Safetensors, RejectsOffsetsOutsideTheFile) {
  expect_error(make_safetensors({{"w", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}}, floats({1, 2})),
               {"t.safetensors", "tensor w", "past the end of the data section"});
  expect_error(make_safetensors({{"w", {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {8, 4}}}}}, floats({1, 2})),
               {"tensor w", "begin after end"});
  expect_error(make_safetensors({{"w", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {-1, 3}}}}}, floats({1})),
               {"tensor w", "data_offsets"});
  expect_error(make_safetensors({{"w", {{"dtype", "F32"}, {"shape", {1}}}}}, floats({1})), {"tensor w", "data_offsets"});
}

TEST(Safetensors, RejectsOverlappingTensors) {
  nlohmann::json h = {{"x", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                      {"y", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}};
  expect_error(make_safetensors(h, floats({1, 2, 3})), {"t.safetensors", "x", "y", "overlap"});
}

TEST(Safetensors, RejectsSizeMismatch) {
  expect_error(make_safetensors({{"w", {{"dtype", "F16"}, {"shape", {3, 2}}, {"data_offsets", {0, 8}}}}}, floats({1, 2})),
               {"tensor w", "F16", "[3, 2]", "needs 12 bytes", "hold 8"});
}

TEST(Safetensors, RejectsUnsupportedDtype) {
  expect_error(make_safetensors({{"w", {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {0, 8}}}}}, floats({1, 2})),
               {"tensor w", "unsupported dtype I64"});
  expect_error(make_safetensors({{"w", {{"dtype", "F8_E4M3"}, {"shape", {4}}, {"data_offsets", {0, 4}}}}}, floats({1})),
               {"unsupported dtype F8_E4M3"});
}

TEST(Safetensors, RejectsBadShapes) {
  expect_error(make_safetensors({{"w", {{"dtype", "F32"}, {"shape", {-2}}, {"data_offsets", {0, 8}}}}}, floats({1, 2})),
               {"tensor w", "shape"});
  // numel overflows 64 bits: must be caught, not wrapped into a small size.
  uint64_t big = uint64_t{1} << 32;
  expect_error(
      make_safetensors({{"w", {{"dtype", "F32"}, {"shape", {big, big}}, {"data_offsets", {0, 0}}}}}, floats({1})),
      {"tensor w", "too large"});
  expect_error(make_safetensors({{"w", {{"shape", {1}}, {"data_offsets", {0, 4}}}}}, floats({1})), {"tensor w", "dtype"});
}

TEST(Safetensors, RejectsDuplicateNamesAcrossFiles) {
  std::string bytes = make_safetensors({{"w", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}}, floats({1}));
  ModelFile m;
  m.path = "dir";
  add_safetensors(m, MappedFile::from_bytes(bytes, "a.safetensors"));
  try {
    add_safetensors(m, MappedFile::from_bytes(bytes, "b.safetensors"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate tensor name w"), std::string::npos) << e.what();
  }
}

// Bytes of a safetensors file whose header is given as text (for headers nlohmann cannot build).
std::string make_raw(const std::string& h, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + data;
}

TEST(SafetensorsHeader, RejectsATensorNameGivenTwice) {
  const std::string h = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                            "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  expect_error(make_raw(h, floats({1, 2})), {"t.safetensors", "tensor w is given twice"});
  // Also inside an entry, and in __metadata__: one JSON object never names a key twice.
  const std::string h2 = R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})";
  expect_error(make_raw(h2, floats({1})), {"t.safetensors", "\"dtype\" appears twice"});
}

TEST(SafetensorsHeader, EveryDataByteBelongsToExactlyOneTensor) {
  nlohmann::json hole = {{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}},
                         {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 12}}}}};
  expect_error(make_safetensors(hole, floats({1, 2, 3})), {"data bytes [4, 8) before tensor b belong to no tensor"});
  nlohmann::json lead = {{"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}};
  expect_error(make_safetensors(lead, floats({1, 2})), {"data bytes [0, 4) before tensor b"});
  nlohmann::json tail = {{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}};
  expect_error(make_safetensors(tail, floats({1, 2})), {"data bytes [4, 8) at the end", "after a"});
  expect_error(make_safetensors(nlohmann::json::object(), floats({1})), {"data bytes [0, 4) at the end"});
  // Covered twice: the same range named by two tensors.
  nlohmann::json twice = {{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}},
                          {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}};
  expect_error(make_safetensors(twice, floats({1})), {"tensors a [0, 4) and b [0, 4) overlap"});
  // Exactly tiled (and an empty tensor anywhere) loads.
  nlohmann::json ok = {{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}},
                       {"e", {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {2, 2}}}},
                       {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}};
  EXPECT_EQ(load_bytes(make_safetensors(ok, floats({1, 2}))).tensors().size(), 3u);
}

// Tensor names and dtype strings from the header reach the message with control bytes escaped.
TEST(SafetensorsHeader, NamesInErrorsAreEscaped) {
  nlohmann::json twice = {{"a\x1b[2J", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}},
                          {"b\x07", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}};
  expect_error(make_safetensors(twice, floats({1})), {"tensors a\\x1b[2J [0, 4) and b\\x07 [0, 4) overlap"});
  nlohmann::json hole = {{"b\x1b]0;X", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {4, 8}}}}};
  expect_error(make_safetensors(hole, floats({1, 2})), {"before tensor b\\x1b]0;X belong to no tensor"});
  nlohmann::json dtype = {{"w", {{"dtype", "F\x1b[2J"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}};
  expect_error(make_safetensors(dtype, floats({1})), {"tensor w: unsupported dtype F\\x1b[2J"});
}

TEST(SafetensorsHeader, OnlySpacesPadTheHeader) {
  const std::string h = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  EXPECT_EQ(load_bytes(make_raw(h + "    ", floats({1}))).tensors().size(), 1u);
  expect_error(make_raw(h + std::string("\0", 1), floats({1})), {"NUL byte at offset " + std::to_string(8 + h.size())});
  expect_error(make_raw(h + "  x", floats({1})), {"invalid JSON"});
  expect_error(make_raw(" " + h, floats({1})), {"does not start with '{'"});
}

TEST(SafetensorsHeader, ErrorsDoNotEchoMegabytesOfInput) {
  const std::string big(1 << 20, 'Q');
  for (const std::string& bytes :
       {make_safetensors({{"w", {{"dtype", big}, {"shape", {1}}, {"data_offsets", {0, 4}}}}}, floats({1})),
        make_safetensors({{big, {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}}, floats({1})),
        make_raw("{\"" + big, "")}) {
    try {
      load_bytes(bytes);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_LT(std::string(e.what()).size(), 600u) << std::string(e.what()).substr(0, 300);
      EXPECT_NE(std::string(e.what()).find(" bytes)"), std::string::npos) << std::string(e.what()).substr(0, 300);
    }
  }
}

// ../shared/fixtures/bugs/safetensors_duplicate_name: model.norm.weight named twice.
TEST(SafetensorsHeader, BugsFixtureDuplicateNameIsAnError) {
  const std::string dir = std::string(MK_SHARED_DIR) + "/fixtures/bugs/safetensors_duplicate_name";
  try {
    load_hf_dir(dir);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor model.norm.weight is given twice"), std::string::npos) << e.what();
  }
}

// Fixture directories of one weights dtype, e.g. "float32".
std::vector<fs::path> fixture_dirs(const std::string& suffix = "") {
  std::vector<fs::path> dirs;
  if (!fs::is_directory(kHfFixtures)) return dirs;
  for (const auto& e : fs::directory_iterator(kHfFixtures))
    if (fs::is_regular_file(e.path() / "config.json") &&
        (suffix.empty() || e.path().filename().string().ends_with(suffix)))
      dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(SafetensorsFixtures, EveryFixtureLoadsWithItsDtype) {
  auto dirs = fixture_dirs();
  if (dirs.empty()) GTEST_SKIP() << "no fixtures under " << kHfFixtures;
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.string());
    ModelFile m = load_safetensors((dir / "model.safetensors").string());
    EXPECT_GT(m.tensors().size(), 10u);
    const DType want = dir.filename().string().ends_with("bfloat16") ? DType::BF16 : DType::F32;
    for (const auto& t : m.tensors()) {
      EXPECT_EQ(t.dtype, want) << t.name;
      EXPECT_EQ(t.nbytes, dtype_bytes(t.dtype, t.numel())) << t.name;
    }
  }
}

// The bf16 fixtures hold the float32 weights rounded to nearest even: check every value.
TEST(SafetensorsFixtures, Bf16IsRoundedF32) {
  auto dirs = fixture_dirs("_float32");
  if (dirs.empty()) GTEST_SKIP() << "no fixtures under " << kHfFixtures;
  for (const auto& f32_dir : dirs) {
    std::string family = f32_dir.filename().string();
    family.resize(family.size() - std::string("_float32").size());
    const fs::path bf16_dir = kHfFixtures / (family + "_bfloat16");
    if (!fs::is_directory(bf16_dir)) continue;
    SCOPED_TRACE(family);
    ModelFile a = load_safetensors((f32_dir / "model.safetensors").string());
    ModelFile b = load_safetensors((bf16_dir / "model.safetensors").string());
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (const auto& ta : a.tensors()) {
      const WeightTensor& tb = b.get(ta.name, ta.shape);
      std::vector<float> fa(ta.numel()), fb(tb.numel());
      to_f32(ta.dtype, ta.data, fa.data(), ta.numel());
      to_f32(tb.dtype, tb.data, fb.data(), tb.numel());
      int64_t mismatches = 0;
      for (size_t i = 0; i < fa.size(); ++i) mismatches += bf16_to_f32(f32_to_bf16(fa[i])) != fb[i];
      EXPECT_EQ(mismatches, 0) << ta.name;
    }
  }
}

}  // namespace
}  // namespace mk
