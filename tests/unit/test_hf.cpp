// Hugging Face directories (config, sharded safetensors, generation config), the RoPE/EOS config
// helpers, and tokenizer.json (byte-level and SentencePiece-style BPE).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "archs/arch.h"
#include "model/hf.h"
#include "model/model_file.h"
#include "model/tokenizer.h"
#include "support/error.h"
#include "support/errors.h"

namespace mk {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
const fs::path kHfFixtures = fs::path(MK_SHARED_DIR) / "fixtures" / "hf";

// A fresh directory under the system temp folder, removed with its contents at scope exit.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / ("mk_test_hf_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  void write(const std::string& name, const std::string& content) const {
    std::ofstream(path_ / name, std::ios::binary) << content;
  }

 private:
  fs::path path_;
};

std::string make_safetensors(const Json& header, const std::string& data) {
  std::string h = header.dump();
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + data;
}

// A one-tensor f32 safetensors file holding `values`.
std::string one_tensor(const std::string& name, std::vector<float> values) {
  std::string data(values.size() * 4, '\0');
  std::memcpy(data.data(), values.data(), data.size());
  return make_safetensors(
      {{name, {{"dtype", "F32"}, {"shape", {values.size()}}, {"data_offsets", {0, data.size()}}}}}, data);
}

template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing " << *parts.begin();
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

std::vector<fs::path> fixture_dirs() {
  std::vector<fs::path> dirs;
  if (!fs::is_directory(kHfFixtures)) return dirs;
  for (const auto& e : fs::directory_iterator(kHfFixtures))
    if (fs::is_regular_file(e.path() / "config.json")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// --- directories ---------------------------------------------------------------------------

TEST(HfDir, LoadsEveryFixtureWithShapesFromConfig) {
  auto dirs = fixture_dirs();
  if (dirs.empty()) GTEST_SKIP() << "no fixtures under " << kHfFixtures;
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.string());
    ModelFile m = load_hf_dir(dir.string());
    EXPECT_EQ(m.format, "hf");
    const auto& c = m.metadata.at("hf.config");
    const std::string type = c.at("model_type").get<std::string>();
    EXPECT_EQ(m.get_str("general.architecture"), type);
    EXPECT_TRUE(m.metadata.contains("hf.generation_config"));
    const int64_t vocab = c.at("vocab_size").get<int64_t>();
    if (type == "gpt2") {
      const int64_t n_embd = c.at("n_embd").get<int64_t>(), n_layer = c.at("n_layer").get<int64_t>();
      m.get("transformer.wte.weight", {vocab, n_embd});
      m.get("transformer.wpe.weight", {c.at("n_positions").get<int64_t>(), n_embd});
      // Conv1D weights are stored [n_in, n_out].
      m.get(fmt::format("transformer.h.{}.attn.c_attn.weight", n_layer - 1), {n_embd, 3 * n_embd});
      EXPECT_EQ(m.find(fmt::format("transformer.h.{}.ln_1.weight", n_layer)), nullptr);
      continue;
    }
    const int64_t hidden = c.at("hidden_size").get<int64_t>(), n_layer = c.at("num_hidden_layers").get<int64_t>();
    const int64_t n_head = c.at("num_attention_heads").get<int64_t>();
    const int64_t n_head_kv = c.value("num_key_value_heads", n_head);
    const int64_t head_dim = c.contains("head_dim") ? c.at("head_dim").get<int64_t>() : hidden / n_head;
    const int64_t n_ff = c.at("intermediate_size").get<int64_t>();
    m.get("model.embed_tokens.weight", {vocab, hidden});
    m.get("model.norm.weight", {hidden});
    EXPECT_EQ(m.find("lm_head.weight") != nullptr, !c.value("tie_word_embeddings", false));
    const std::string blk = fmt::format("model.layers.{}.", n_layer - 1);
    if (type == "phi3") {
      m.get(blk + "self_attn.qkv_proj.weight", {(n_head + 2 * n_head_kv) * head_dim, hidden});
      m.get(blk + "mlp.gate_up_proj.weight", {2 * n_ff, hidden});
    } else {
      m.get(blk + "self_attn.q_proj.weight", {n_head * head_dim, hidden});
      m.get(blk + "self_attn.k_proj.weight", {n_head_kv * head_dim, hidden});
      m.get(blk + "mlp.gate_proj.weight", {n_ff, hidden});
    }
    m.get(blk + "self_attn.o_proj.weight", {hidden, n_head * head_dim});
    m.get(blk + "mlp.down_proj.weight", {hidden, n_ff});
    EXPECT_EQ(m.find(fmt::format("model.layers.{}.input_layernorm.weight", n_layer)), nullptr);
  }
}

const char* kConfig = R"({"model_type": "llama", "hidden_size": 4})";

// num_hidden_layers (n_layer for GPT-2) below the checkpoint's layers: refused, naming a tensor of a
// dropped layer and the config key, instead of running without the extra layers.
TEST(HfDir, LayerCountBelowTheCheckpointsLayersIsRefused) {
  for (const auto& [fixture, key, layer_name] :
       {std::tuple<const char*, const char*, const char*>{"llama_gqa_float32", "num_hidden_layers", "model.layers.1."},
        {"gpt2_float32", "n_layer", "transformer.h.1."}}) {
    const fs::path src = kHfFixtures / fixture;
    if (!fs::is_directory(src)) GTEST_SKIP() << "no fixture " << src;
    TempDir d;
    for (const char* f : {"model.safetensors", "tokenizer.json", "generation_config.json"})
      fs::create_symlink(src / f, d.path() / f);
    Json config = Json::parse(std::ifstream(src / "config.json"));
    ASSERT_EQ(config[key], 3);
    EXPECT_NO_THROW(build_graph(load_model(src.string()), {}));  // the true count builds
    config[key] = 1;
    d.write("config.json", config.dump());
    const ModelFile m = load_model(d.str());
    expect_error([&] { build_graph(m, {}); },
                 {layer_name, "belongs to layer 1, but the layer count is 1", std::string("(config.json ") + key + " = 1)"});
  }
}

// Config values that float32 cannot hold, or that name the wrong field (new-user trial 48): an
// rms_norm_eps that overflows (1e39) or underflows (1e-50) float32 gave zero logits silently; an
// odd head_dim was blamed on partial_rotary_factor, which the config did not set.
TEST(HfDir, EpsilonOutsideFloat32OddHeadDimAndMissingBiasesAreNamed) {
  const fs::path src = kHfFixtures / "llama_gqa_float32";
  if (!fs::is_directory(src)) GTEST_SKIP() << "no fixture " << src;
  for (const auto& [key, value, want] : {std::tuple<const char*, Json, const char*>{"rms_norm_eps", 1e39, "within float32's range, got 1e+39"},
                                         {"rms_norm_eps", 1e-50, "within float32's range, got 1e-50"},
                                         {"head_dim", 17, "head_dim 17 (hidden_size / num_attention_heads, or head_dim) must be even"},
                                         {"attention_bias", true, "config.json sets attention_bias true, but tensor model.layers.0.self_attn.q_proj.bias is missing"},
                                         {"mlp_bias", true, "config.json sets mlp_bias true, but tensor model.layers.0.mlp.gate_proj.bias is missing"}}) {
    TempDir d;
    for (const char* f : {"model.safetensors", "tokenizer.json", "generation_config.json"}) fs::create_symlink(src / f, d.path() / f);
    Json config = Json::parse(std::ifstream(src / "config.json"));
    config[key] = value;
    d.write("config.json", config.dump());
    const std::string e = test::error_of([&] { build_graph(load_model(d.str()), {}); });
    EXPECT_NE(e.find(want), std::string::npos) << key << ": " << e;
  }
}

TEST(HfDir, MissingConfig) {
  TempDir d;
  d.write("model.safetensors", one_tensor("w", {1}));
  expect_error([&] { load_hf_dir(d.str()); }, {d.str(), "missing config.json"});
  expect_error([&] { load_hf_dir((d.path() / "nope").string()); }, {"nope", "not a directory"});
}

TEST(HfDir, InvalidConfigJson) {
  TempDir d;
  d.write("config.json", R"({"model_type": "llama",)");
  d.write("model.safetensors", one_tensor("w", {1}));
  expect_error([&] { load_hf_dir(d.str()); }, {"config.json", "invalid JSON"});
  d.write("config.json", "[1, 2]");
  expect_error([&] { load_hf_dir(d.str()); }, {"config.json", "not a JSON object"});
}

TEST(HfDir, MissingModelType) {
  TempDir d;
  d.write("config.json", R"({"hidden_size": 4})");
  d.write("model.safetensors", one_tensor("w", {1}));
  expect_error([&] { load_hf_dir(d.str()); }, {"config.json", "missing model_type"});
  d.write("config.json", R"({"model_type": 7})");
  expect_error([&] { load_hf_dir(d.str()); }, {"config.json", "model_type is not a string"});
}

TEST(HfDir, MissingWeights) {
  TempDir d;
  d.write("config.json", kConfig);
  expect_error([&] { load_hf_dir(d.str()); }, {d.str(), "no model.safetensors"});
}

TEST(HfDir, InvalidGenerationConfig) {
  TempDir d;
  d.write("config.json", kConfig);
  d.write("model.safetensors", one_tensor("w", {1}));
  d.write("generation_config.json", "{eos}");
  expect_error([&] { load_hf_dir(d.str()); }, {"generation_config.json", "invalid JSON"});
}

TEST(HfDir, LoadsShardsEachMappedOnce) {
  TempDir d;
  d.write("config.json", kConfig);
  std::string data(12, '\0');
  const float v[3] = {1, 2, 3};
  std::memcpy(data.data(), v, 12);
  d.write("model-00001-of-00002.safetensors",
          make_safetensors({{"a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}},
                            {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {4, 12}}}}},
                           data));
  d.write("model-00002-of-00002.safetensors", one_tensor("c", {4, 5}));
  d.write("model.safetensors.index.json", R"({"metadata": {"total_size": 20}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors",
      "b": "model-00001-of-00002.safetensors"}})");
  ModelFile m = load_hf_dir(d.str());
  EXPECT_EQ(m.files.size(), 2u);
  ASSERT_EQ(m.tensors().size(), 3u);
  float x[2];
  const WeightTensor& c = m.get("c", {2});
  to_f32(c.dtype, c.data, x, 2);
  EXPECT_EQ(x[1], 5.0f);
  const WeightTensor& b = m.get("b", {2});
  to_f32(b.dtype, b.data, x, 2);
  EXPECT_EQ(x[0], 2.0f);
}

TEST(HfDir, IndexNamingMissingShard) {
  TempDir d;
  d.write("config.json", kConfig);
  d.write("model-00001-of-00002.safetensors", one_tensor("a", {1}));
  d.write("model.safetensors.index.json", R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
      "lm_head.weight": "model-00002-of-00002.safetensors"}})");
  expect_error([&] { load_hf_dir(d.str()); },
               {"model.safetensors.index.json", "model-00002-of-00002.safetensors", "lm_head.weight", "not found"});
}

TEST(HfDir, IndexListsTensorAbsentFromShard) {
  TempDir d;
  d.write("config.json", kConfig);
  d.write("s1.safetensors", one_tensor("a", {1}));
  d.write("model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  expect_error([&] { load_hf_dir(d.str()); }, {"tensor b", "s1.safetensors", "not stored there"});
}

TEST(HfDir, IndexShardNameMustStayInTheDirectory) {
  TempDir d;
  d.write("config.json", kConfig);
  d.write("model.safetensors.index.json", R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
  expect_error([&] { load_hf_dir(d.str()); }, {"../elsewhere.safetensors", "not a plain file name"});
  d.write("model.safetensors.index.json", R"({"weights": {}})");
  expect_error([&] { load_hf_dir(d.str()); }, {"model.safetensors.index.json", "weight_map"});
}

// --- RoPE and EOS config helpers -----------------------------------------------------------

TEST(HfRope, TransformersFiveRopeParameters) {
  if (!fs::is_directory(kHfFixtures)) GTEST_SKIP() << "no fixtures under " << kHfFixtures;
  HfRope r = read_hf_rope(read_json_file((kHfFixtures / "llama3_scaled_tied_float32" / "config.json").string()));
  EXPECT_EQ(r.type, "llama3");
  EXPECT_EQ(r.theta, 500000.0);
  EXPECT_EQ(r.factor, 8.0);
  EXPECT_EQ(r.low_freq_factor, 1.0);
  EXPECT_EQ(r.high_freq_factor, 4.0);
  EXPECT_EQ(r.original_max_position_embeddings, 64);
  HfRope q = read_hf_rope(read_json_file((kHfFixtures / "qwen2_bias_float32" / "config.json").string()));
  EXPECT_EQ(q.type, "default");
  EXPECT_EQ(q.theta, 1000000.0);
}

TEST(HfRope, OlderTopLevelThetaAndRopeScaling) {
  HfRope r = read_hf_rope(Json::parse(R"({"rope_theta": 500000.0, "rope_scaling": {"factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
      "rope_type": "llama3"}})"));
  EXPECT_EQ(r.type, "llama3");
  EXPECT_EQ(r.theta, 500000.0);
  EXPECT_EQ(r.factor, 32.0);
  EXPECT_EQ(r.original_max_position_embeddings, 8192);

  HfRope lin = read_hf_rope(Json::parse(R"({"rope_theta": 10000, "rope_scaling": {"type": "linear", "factor": 2}})"));
  EXPECT_EQ(lin.type, "linear");
  EXPECT_EQ(lin.factor, 2.0);

  HfRope none = read_hf_rope(Json::parse(R"({"rope_theta": 1000000.0, "rope_scaling": null})"));
  EXPECT_EQ(none.type, "default");
  EXPECT_EQ(none.theta, 1000000.0);

  HfRope dflt = read_hf_rope(Json::parse(R"({"model_type": "llama"})"));
  EXPECT_EQ(dflt.type, "default");
  EXPECT_EQ(dflt.theta, 10000.0);

  HfRope partial = read_hf_rope(Json::parse(R"({"partial_rotary_factor": 0.5})"));
  EXPECT_EQ(partial.partial_rotary_factor, 0.5);
}

TEST(HfRope, RejectsUnsupportedOrIncomplete) {
  expect_error([] { read_hf_rope(Json::parse(R"({"rope_scaling": {"type": "yarn", "factor": 4}})")); },
               {"unsupported RoPE type yarn"});
  expect_error([] { read_hf_rope(Json::parse(R"({"rope_parameters": {"rope_type": "llama3", "factor": 8}})")); },
               {"rope_parameters", "low_freq_factor"});
  expect_error([] { read_hf_rope(Json::parse(R"({"rope_scaling": {"type": "linear"}})")); }, {"rope_scaling", "factor"});
  expect_error([] { read_hf_rope(Json::parse(R"({"rope_parameters": {"full_attention": {"rope_theta": 1}}})")); },
               {"per layer type"});
}

TEST(HfEos, FromGenerationConfigThenConfig) {
  if (!fs::is_directory(kHfFixtures)) GTEST_SKIP() << "no fixtures under " << kHfFixtures;
  EXPECT_EQ(read_hf_eos_ids(load_hf_dir((kHfFixtures / "gpt2_float32").string())), std::vector<int32_t>{50256});
  EXPECT_EQ(read_hf_eos_ids(load_hf_dir((kHfFixtures / "llama_gqa_float32").string())), std::vector<int32_t>{2});
  EXPECT_TRUE(read_hf_eos_ids(load_hf_dir((kHfFixtures / "qwen2_bias_float32").string())).empty());

  ModelFile m;
  m.metadata["hf.config"] = Json::parse(R"({"eos_token_id": 3})");
  EXPECT_EQ(read_hf_eos_ids(m), std::vector<int32_t>{3});
  m.metadata["hf.generation_config"] = Json::parse(R"({"bos_token_id": 1})");
  EXPECT_EQ(read_hf_eos_ids(m), std::vector<int32_t>{3});
  m.metadata["hf.generation_config"] = Json::parse(R"({"eos_token_id": [128001, 128009, 128001]})");
  EXPECT_EQ(read_hf_eos_ids(m), (std::vector<int32_t>{128001, 128009}));
  m.metadata["hf.generation_config"] = Json::parse(R"({"eos_token_id": "x"})");
  expect_error([&] { read_hf_eos_ids(m); }, {"generation_config.json", "eos_token_id"});
}

// --- tokenizer.json ------------------------------------------------------------------------

// Concatenated raw bytes of `ids`, as a streaming decoder would produce them.
std::string detokenize(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::string s;
  int32_t prev = -1;
  for (int32_t id : ids) {
    s += t.token_bytes(prev, id);
    prev = id;
  }
  return s;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Checks every case of bytelevel_bpe_expected.json against `tok`.
void check_expected_cases(const Tokenizer& tok) {
  Json cases = Json::parse(read_file(kHfFixtures / "bytelevel_bpe_expected.json"));
  ASSERT_GT(cases.size(), 5u);
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    SCOPED_TRACE(text);
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, false), want);
    EXPECT_EQ(tok.encode(text, true), want);  // this tokenizer has no BOS
    EXPECT_EQ(detokenize(tok, want), text);
  }
}

TEST(HfTokenizer, ByteLevelBpeMatchesExpectedIds) {
  if (!fs::is_directory(kHfFixtures)) GTEST_SKIP() << "no fixtures under " << kHfFixtures;
  auto tok = load_hf_tokenizer_json((kHfFixtures / "bytelevel_bpe_tokenizer.json").string());
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->bos_id, -1);
  EXPECT_EQ(tok->eos_id, 0);  // <|endoftext|>, a special added token
  check_expected_cases(*tok);
}

// Llama 3 / Qwen 2 write the same pipeline as Split(regex) + ByteLevel(use_regex=false), and
// newer files write merges as ["a", "b"] pairs or "a b" strings: all must give the same ids.
TEST(HfTokenizer, SplitRegexAndMergeStringForms) {
  if (!fs::is_directory(kHfFixtures)) GTEST_SKIP() << "no fixtures under " << kHfFixtures;
  Json j = Json::parse(read_file(kHfFixtures / "bytelevel_bpe_tokenizer.json"));
  j["pre_tokenizer"] = Json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
       "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})");
  Json merges = Json::array();
  for (const auto& m : j["model"]["merges"])
    merges.push_back(m.is_array() ? Json(m[0].get<std::string>() + " " + m[1].get<std::string>()) : m);
  j["model"]["merges"] = merges;
  j["normalizer"] = Json::parse(R"({"type": "NFC"})");
  check_expected_cases(*parse_hf_tokenizer_json(j.dump(), "split.json"));
}

TEST(HfTokenizer, EveryFixtureTokenizerLoads) {
  auto dirs = fixture_dirs();
  if (dirs.empty()) GTEST_SKIP() << "no fixtures under " << kHfFixtures;
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.string());
    ModelFile m = load_hf_dir(dir.string());
    auto tok = load_hf_tokenizer(m);
    EXPECT_EQ(tok->n_vocab(), m.metadata.at("hf.config").at("vocab_size").get<int32_t>());
    EXPECT_EQ(tok->encode("Hello world", false), (std::vector<int32_t>{40, 69, 275, 79, 309, 261, 76, 68}));
    // EOS comes from the configs when inside the vocabulary, else from the <|endoftext|> token.
    auto eos = read_hf_eos_ids(m);
    EXPECT_EQ(tok->eos_id, !eos.empty() && eos[0] < 512 ? eos[0] : 0);
  }
}

TEST(HfTokenizer, AddedTokensAreMatchedWhole) {
  if (!fs::is_directory(kHfFixtures)) GTEST_SKIP() << "no fixtures under " << kHfFixtures;
  auto tok = load_hf_tokenizer_json((kHfFixtures / "bytelevel_bpe_tokenizer.json").string());
  auto a = tok->encode("Hi", false), b = tok->encode(" there", false);
  std::vector<int32_t> want = a;
  want.push_back(0);
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(tok->encode("Hi<|endoftext|> there", false), want);
  EXPECT_EQ(tok->token_bytes(-1, 0), "");  // special tokens decode to nothing
  EXPECT_EQ(tok->token_bytes(-1, 100000), "");
}

TEST(HfTokenizer, RejectsInvalidUtf8Input) {
  if (!fs::is_directory(kHfFixtures)) GTEST_SKIP() << "no fixtures under " << kHfFixtures;
  auto tok = load_hf_tokenizer_json((kHfFixtures / "bytelevel_bpe_tokenizer.json").string());
  expect_error([&] { tok->encode("ab\xC3", false); }, {"not valid UTF-8", "offset 2"});
}

// A small SentencePiece-style vocabulary: specials, the 256 byte tokens, letters and merges that
// build "▁hello" and "▁world".
Json spm_tokenizer_json() {
  Json vocab = Json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int next = 259;
  for (const char* p : {"\xE2\x96\x81", "h", "e", "l", "o", "w", "r", "d"}) vocab[p] = next++;
  Json merges = Json::array();
  for (auto [a, b] : std::vector<std::pair<std::string, std::string>>{{"\xE2\x96\x81", "h"},
                                                                      {"l", "l"},
                                                                      {"e", "ll"},
                                                                      {"\xE2\x96\x81h", "ell"},
                                                                      {"\xE2\x96\x81hell", "o"},
                                                                      {"\xE2\x96\x81", "w"},
                                                                      {"o", "r"},
                                                                      {"\xE2\x96\x81w", "or"},
                                                                      {"\xE2\x96\x81wor", "l"},
                                                                      {"\xE2\x96\x81worl", "d"}}) {
    vocab[a + b] = next++;
    merges.push_back(Json::array({a, b}));
  }
  Json j;
  j["version"] = "1.0";
  j["added_tokens"] = Json::parse(R"([{"id": 0, "content": "<unk>", "special": true},
      {"id": 1, "content": "<s>", "special": true}, {"id": 2, "content": "</s>", "special": true}])");
  // Llama 2 "legacy" form: normalizer prepends and replaces, no pre-tokenizer.
  j["normalizer"] = Json::parse(R"({"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})");
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = Json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}})");
  j["decoder"] = Json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  j["model"] = {{"type", "BPE"},        {"dropout", nullptr}, {"unk_token", "<unk>"}, {"fuse_unk", true},
                {"byte_fallback", true}, {"vocab", vocab},     {"merges", merges}};
  return j;
}

void check_spm(const Tokenizer& tok) {
  const int32_t hello = 259 + 8 + 4, world = 259 + 8 + 9;  // ids of ▁hello and ▁world
  EXPECT_EQ(tok.bos_id, 1);
  EXPECT_EQ(tok.eos_id, 2);
  EXPECT_EQ(tok.unk_id, 0);
  EXPECT_EQ(tok.encode("hello world", false), (std::vector<int32_t>{hello, world}));
  EXPECT_EQ(tok.encode("hello world", true), (std::vector<int32_t>{1, hello, world}));
  // "é" is not in the vocabulary: its two UTF-8 bytes become <0xC3> <0xA9>.
  const std::vector<int32_t> he = {259 + 8, 3 + 0xC3, 3 + 0xA9};  // ▁h, then the bytes of é
  EXPECT_EQ(tok.encode("h\xC3\xA9", false), he);
  EXPECT_EQ(detokenize(tok, he), "h\xC3\xA9");  // the dummy-prefix space is dropped at the start
  EXPECT_EQ(detokenize(tok, {1, hello, world}), "hello world");
  EXPECT_EQ(tok.token_bytes(hello, world), " world");
}

TEST(HfTokenizer, SentencePieceStyleLegacyNormalizer) {
  Json j = spm_tokenizer_json();
  check_spm(*parse_hf_tokenizer_json(j.dump(), "spm.json", {2}));
}

TEST(HfTokenizer, SentencePieceStyleMetaspace) {
  Json j = spm_tokenizer_json();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = Json::parse(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false})");
  j["decoder"] = Json::parse(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": false})");
  check_spm(*parse_hf_tokenizer_json(j.dump(), "spm_meta.json", {2}));
  j["pre_tokenizer"]["split"] = true;
  check_spm(*parse_hf_tokenizer_json(j.dump(), "spm_meta_split.json", {2}));
}

TEST(HfTokenizer, UnknownCharactersWithoutByteFallback) {
  Json j = spm_tokenizer_json();
  j["model"]["byte_fallback"] = false;
  j["decoder"] = nullptr;
  auto tok = parse_hf_tokenizer_json(j.dump(), "spm_unk.json");
  // Consecutive unknown characters fuse into one <unk> (fuse_unk).
  EXPECT_EQ(tok->encode("h\xC3\xA9\xC3\xA9", false), (std::vector<int32_t>{259 + 8, 0}));
  EXPECT_EQ(tok->eos_id, 2);  // </s> found among the special added tokens
}

TEST(HfTokenizer, RejectsUnsupportedOrDamagedFiles) {
  Json j = spm_tokenizer_json();
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    j["model"]["type"] = type;
    expect_error([&] { parse_hf_tokenizer_json(j.dump(), "bad.json"); },
                 {"bad.json", std::string("unsupported tokenizer model type ") + type});
  }
  j = spm_tokenizer_json();
  j["pre_tokenizer"] = Json::parse(R"({"type": "Whitespace"})");
  expect_error([&] { parse_hf_tokenizer_json(j.dump(), "bad.json"); }, {"unsupported pre_tokenizer type Whitespace"});
  j = spm_tokenizer_json();
  j["normalizer"] = Json::parse(R"({"type": "BertNormalizer"})");  // Lowercase is supported now
  expect_error([&] { parse_hf_tokenizer_json(j.dump(), "bad.json"); }, {"normalizer BertNormalizer is not supported"});
  j = spm_tokenizer_json();
  j["model"]["merges"].push_back(Json::array({"q", "z"}));
  expect_error([&] { parse_hf_tokenizer_json(j.dump(), "bad.json"); }, {"bad.json", "merge", "\"q\""});
  j = spm_tokenizer_json();
  j["model"]["merges"].push_back("a b c");
  expect_error([&] { parse_hf_tokenizer_json(j.dump(), "bad.json"); }, {"a b c"});
  j = spm_tokenizer_json();
  j["model"]["vocab"] = 5;
  expect_error([&] { parse_hf_tokenizer_json(j.dump(), "bad.json"); }, {"model.vocab"});
  j = spm_tokenizer_json();
  j["pre_tokenizer"] = Json::parse(R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})");
  expect_error([&] { parse_hf_tokenizer_json(j.dump(), "bad.json"); }, {"bad.json", "regex"});
  j = spm_tokenizer_json();
  j["pre_tokenizer"] = Json::parse(R"({"type": "ByteLevel", "add_prefix_space": "yes"})");
  expect_error([&] { parse_hf_tokenizer_json(j.dump(), "bad.json"); }, {"bad.json", "malformed"});
  expect_error([&] { parse_hf_tokenizer_json("{\"model\": ", "bad.json"); }, {"bad.json", "invalid JSON"});
  expect_error([&] { load_hf_tokenizer_json("/nonexistent/tokenizer.json"); }, {"/nonexistent/tokenizer.json"});
}

}  // namespace
}  // namespace mk
