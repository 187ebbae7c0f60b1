// The keys and tensors of Gemma 2, Gemma 3, Llama 3 rope_freqs and Phi-3 LongRoPE: honoured as the
// graph shows (which layers are windowed and soft-capped, which RoPE base and factors each uses), or
// refused by name. The logits themselves are checked against llama.cpp in tests/e2e (test_gemma2.cpp, test_gemma3.cpp,
// test_phi3_longrope.cpp, test_gguf_families.cpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <tuple>
#include <sstream>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "model/tokenizer.h"
#include "support/errors.h"

namespace mk {
namespace {

const std::string kData = std::string(MK_SOURCE_DIR) + "/tests/data/";
const std::string kGemma2 = kData + "gemma2/gemma2-tiny.f32.gguf";
const std::string kGemma3 = kData + "gemma3/gemma3-tiny.f32.gguf";
const std::string kPhi3 = kData + "phi3_longrope/phi3-longrope.f32.gguf";
const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";

// Per layer: the attention window (0 = global) and the theta of its q RoPE.
struct LayerView {
  std::vector<int64_t> window;
  std::vector<double> theta;
  std::vector<std::string> factors;
};

LayerView layers(const Graph& g) {
  LayerView v;
  for (const Node& n : g.nodes) {
    if (n.op == Op::attention) v.window.push_back(n.attr_int("window", 0));
    if (n.op == Op::rope && n.name.ends_with(".q_rope")) {
      v.theta.push_back(n.attr_float("theta"));
      v.factors.push_back(n.attr_str("freq_factors", ""));
    }
  }
  return v;
}

std::string build_error(const std::string& path, const std::function<void(ModelFile&)>& edit, int64_t n_ctx = 32) {
  ModelFile m = load_model(path);
  edit(m);
  return test::error_of([&] { build_graph(m, {n_ctx, false}); });
}

bool has(const std::string& e, const std::string& part) { return e.find(part) != std::string::npos; }

TEST(GgufGemma3, WindowPatternAndLocalRopeBase) {
  ModelFile m = load_model(kGemma3);
  LayerView v = layers(build_graph(m, {32, false}));
  EXPECT_EQ(v.window, (std::vector<int64_t>{8, 8, 8, 8, 8, 0}));  // llama.cpp set_swa_pattern(6)
  EXPECT_EQ(v.theta, (std::vector<double>{1e4, 1e4, 1e4, 1e4, 1e4, 1e6}));
  m.metadata["gemma3.attention.sliding_window_pattern"] = 2u;
  m.metadata["gemma3.rope.freq_base_swa"] = 5000.0;
  v = layers(build_graph(m, {32, false}));
  EXPECT_EQ(v.window, (std::vector<int64_t>{8, 0, 8, 0, 8, 0}));
  EXPECT_EQ(v.theta, (std::vector<double>{5000, 1e6, 5000, 1e6, 5000, 1e6}));
  m.metadata["gemma3.attention.sliding_window_pattern"] =
      nlohmann::ordered_json::array({false, true, true, false, true, true});
  EXPECT_EQ(layers(build_graph(m, {32, false})).window, (std::vector<int64_t>{0, 8, 8, 0, 8, 8}));
  m.metadata["gemma3.attention.sliding_window"] = 0u;  // no window: every layer global
  v = layers(build_graph(m, {32, false}));
  EXPECT_EQ(v.window, (std::vector<int64_t>(6, 0)));
  EXPECT_EQ(v.theta, (std::vector<double>(6, 1e6)));
}

TEST(GgufGemma3, BadKeysAreRefusedByName) {
  EXPECT_TRUE(has(build_error(kGemma3, [](ModelFile& m) { m.metadata["gemma3.final_logit_softcapping"] = 30.0; }),
                  "final logit soft-capping"));
  EXPECT_TRUE(
      has(build_error(
              kGemma3,
              [](ModelFile& m) {
                m.metadata["gemma3.attention.sliding_window_pattern"] = nlohmann::ordered_json::array({true, false});
              }),
          "lists 2 layers, the model has 6"));
  EXPECT_TRUE(
      has(build_error(kGemma3, [](ModelFile& m) { m.metadata["gemma3.attention.sliding_window_pattern"] = 9u; }),
          "sliding_window_pattern = 9"));
  // A gemma3 file without its per-layer norms is not read as something else.
  ModelFile m = load_model(kGemma3);
  ModelFile stripped;
  stripped.path = m.path;
  stripped.format = m.format;
  stripped.metadata = m.metadata;
  for (const auto& t : m.tensors())
    if (t.name != "blk.3.post_ffw_norm.weight") stripped.add_tensor(t);
  EXPECT_TRUE(has(test::error_of([&] {
                    build_graph(stripped, {32, false});
                  }),
                  "missing tensor blk.3.post_ffw_norm.weight"));
  // Other families still refuse a sliding window.
  EXPECT_TRUE(has(build_error(
                      kStories, [](ModelFile& m) { m.metadata["llama.attention.sliding_window"] = 8u; }, 16),
                  "sliding-window attention"));
}

// Gemma 2: llama.cpp's defaults where a key is absent (window 4096 on the even layers, caps 50 and
// 30), 0 turns a window or a cap off, and a negative or non-finite cap is refused by name.
TEST(GgufGemma2, WindowsAndSoftCapsWithLlamaCppDefaults) {
  const auto view = [](const ModelFile& m) {
    const Graph g = build_graph(m, {32, false});
    std::vector<int64_t> windows;
    std::vector<double> caps;
    double final_cap = 0;
    for (const Node& n : g.nodes) {
      if (n.op == Op::attention) windows.push_back(n.attr_int("window", 0)), caps.push_back(n.attr_float("softcap", 0));
      if (n.op == Op::softcap) final_cap = n.attr_float("cap");
    }
    return std::tuple{windows, caps, final_cap};
  };
  ModelFile m = load_model(kGemma2);
  EXPECT_EQ(view(m), (std::tuple{std::vector<int64_t>{8, 0, 8, 0}, std::vector<double>(4, 2.0), 6.0}));
  for (const char* k : {"gemma2.attention.sliding_window", "gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"})
    m.metadata.erase(k);
  EXPECT_EQ(view(m), (std::tuple{std::vector<int64_t>{4096, 0, 4096, 0}, std::vector<double>(4, 50.0), 30.0}));
  m.metadata["gemma2.attention.sliding_window"] = 0u;
  m.metadata["gemma2.attn_logit_softcapping"] = 0.0;
  m.metadata["gemma2.final_logit_softcapping"] = 0.0;
  EXPECT_EQ(view(m), (std::tuple{std::vector<int64_t>(4, 0), std::vector<double>(4, 0.0), 0.0}));
  for (const double bad : {-1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    EXPECT_TRUE(has(build_error(kGemma2, [&](ModelFile& f) { f.metadata["gemma2.attn_logit_softcapping"] = bad; }),
                    "gemma2.attn_logit_softcapping"))
        << bad;
    EXPECT_TRUE(has(build_error(kGemma2, [&](ModelFile& f) { f.metadata["gemma2.final_logit_softcapping"] = bad; }),
                    "gemma2.final_logit_softcapping"))
        << bad;
  }
  EXPECT_TRUE(has(build_error(kGemma2, [](ModelFile& f) { f.metadata["gemma2.attention.sliding_window"] = -3; }),
                  "gemma2.attention.sliding_window"));
  // Other families still refuse the caps (llama: attention logit soft-capping is not supported).
  EXPECT_TRUE(has(build_error(
                      kStories, [](ModelFile& f) { f.metadata["llama.attn_logit_softcapping"] = 50.0; }, 16),
                  "attention logit soft-capping"));
}

// Keys and string values read from a GGUF reach error messages (and the `run --ids` warning, which
// prints the tokenizer's error) with control and non-UTF-8 bytes escaped: a NUL no longer cuts the
// message and an ESC no longer reaches the terminal.
void expect_printable(const std::string& msg, const std::string& part) {
  EXPECT_TRUE(has(msg, part)) << msg;
  for (char c : msg) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "raw byte " << int(static_cast<unsigned char>(c)) << " in: " << msg;
}

TEST(GgufArchStrings, KeysAndValuesAreEscapedInErrors) {
  expect_printable(build_error(kStories,
                               [](ModelFile& m) { m.metadata[std::string("llama.\xff\x00\x09\x07", 10)] = 1u; }),
                   "metadata key llama.\\xff\\x00\\x09\\x07 is not supported for the llama architecture");
  expect_printable(build_error(kStories, [](ModelFile& m) { m.metadata["llama.\x1b[2J"] = 1u; }),
                   "metadata key llama.\\x1b[2J is not supported");
  expect_printable(build_error(kStories, [](ModelFile& m) { m.metadata["llama.\x1b]0;logit_scale"] = 2.0; }),
                   "metadata key llama.\\x1b]0;logit_scale is not supported");
  expect_printable(build_error(kStories, [](ModelFile& m) { m.metadata["general.architecture"] = "\x1b[2J\xff"; }),
                   "unsupported architecture '\\x1b[2J\\xff' (gguf file)");
  expect_printable(build_error(kStories, [](ModelFile& m) { m.metadata["llama.rope.scaling.type"] = "yarn\x1b[2J"; }),
                   "llama.rope.scaling.type = yarn\\x1b[2J is not supported");
  ModelFile m = load_model(kStories);
  m.metadata["tokenizer.ggml.model"] = "\x1b]0;X";
  expect_printable(test::error_of([&] { load_model_tokenizer(m); }), "tokenizer model \"\\x1b]0;X\" is not supported");
  m.metadata["tokenizer.ggml.model"] = "gpt2";
  m.metadata["tokenizer.ggml.merges"] = nlohmann::ordered_json::array();
  m.metadata["tokenizer.ggml.pre"] = "q\x07\xc3";
  expect_printable(test::error_of([&] { load_model_tokenizer(m); }), "tokenizer.ggml.pre = \"q\\x07\\xc3\"");
}

TEST(GgufRopeFactors, Llama3RopeFreqsReachEveryRope) {
  static const std::vector<float> factors = {1, 1, 2, 4};  // stories260K: head_dim 8, 4 pairs
  auto with = [](std::vector<int64_t> shape, const float* data) {
    return [shape, data](ModelFile& m) {
      m.add_tensor(WeightTensor{"rope_freqs.weight", DType::F32, shape, reinterpret_cast<const uint8_t*>(data),
                                static_cast<size_t>(shape[0]) * 4, 0});
    };
  };
  ModelFile m = load_model(kStories);
  with({4}, factors.data())(m);
  const LayerView v = layers(build_graph(m, {16, false}));
  ASSERT_FALSE(v.factors.empty());
  for (const auto& f : v.factors) EXPECT_EQ(f, "1,1,2,4");
  EXPECT_TRUE(has(build_error(kStories, with({3}, factors.data()), 16), "rope_freqs.weight must be f32[4]"));
  static const std::vector<float> bad = {1, 0, 1, 1};
  EXPECT_TRUE(
      has(build_error(kStories, with({4}, bad.data()), 16), "rope_freqs.weight[1] = 0 must be a positive number"));
}

TEST(GgufRopeFactors, Phi3LongRopePicksFactorsByContext) {
  ModelFile m = load_model(kPhi3);
  const std::string lng = layers(build_graph(m, {64, false})).factors.at(0),
                    sht = layers(build_graph(m, {32, false})).factors.at(0);
  EXPECT_TRUE(lng.starts_with("1,")) << lng;  // the long factors rise from 1 to 40
  EXPECT_NE(lng, sht);
  EXPECT_EQ(layers(build_graph(m, {33, false})).factors.at(0), lng);  // just past the original 32
  ModelFile one;
  one.path = m.path;
  one.format = m.format;
  one.metadata = m.metadata;
  for (const auto& t : m.tensors())
    if (t.name != "rope_factors_short.weight") one.add_tensor(t);
  EXPECT_TRUE(has(test::error_of([&] { build_graph(one, {32, false}); }), "needs both"));
  // phi3.attention.sliding_window: every layer windowed, with the same RoPE.
  m.metadata["phi3.attention.sliding_window"] = 8u;
  const LayerView w = layers(build_graph(m, {64, false}));
  EXPECT_EQ(w.window, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(w.factors.at(0), lng);
  EXPECT_TRUE(has(build_error(kPhi3, [](ModelFile& m) { m.metadata["phi3.rope.scaling.attn_factor"] = 0.0; }),
                  "phi3.rope.scaling.attn_factor = 0 must be a positive number"));
}

// HF sliding windows as transformers' configs ask (new-user trial 40: the window used to cap the
// context instead): MistralConfig / Phi3Config window every layer when sliding_window is set;
// Qwen2Config / Qwen3Config only with use_sliding_window, from max_window_layers on (or per
// layer_types); LlamaConfig ignores the key. max_position_embeddings stays the training context.
TEST(HfSlidingWindow, LayersAsTransformersConfigsSay) {
  const std::string hf = std::string(MK_SHARED_DIR) + "/fixtures/hf/";
  if (!std::filesystem::is_directory(hf)) GTEST_SKIP() << "no fixtures under " << hf;
  const auto windows = [&](const std::string& dir, const std::function<void(nlohmann::ordered_json&)>& edit) {
    ModelFile m = load_model(hf + dir);
    edit(m.metadata["hf.config"]);
    EXPECT_EQ(read_hparams(m).n_ctx_train, m.metadata["hf.config"]["max_position_embeddings"].get<int64_t>()) << dir;
    return layers(build_graph(m, {64, false})).window;  // a context past every window
  };
  using W = std::vector<int64_t>;
  EXPECT_EQ(windows("mistral_float32", [](auto&) {}), (W{0, 0, 0}));  // sliding_window null
  EXPECT_EQ(windows("mistral_float32", [](auto& c) { c["sliding_window"] = 4; }), (W{4, 4, 4}));
  EXPECT_EQ(windows("phi3_float32", [](auto& c) { c["sliding_window"] = 6; }), (W{6, 6, 6}));
  EXPECT_EQ(windows("llama_gqa_float32", [](auto& c) { c["sliding_window"] = 4; }), (W{0, 0, 0}));
  // Qwen2: use_sliding_window false (the fixture's) or absent: no window; true: layers >= max_window_layers.
  EXPECT_EQ(windows("qwen2_bias_float32", [](auto& c) { c["sliding_window"] = 4; }), (W{0, 0, 0}));
  EXPECT_EQ(windows("qwen2_bias_float32", [](auto& c) { c["sliding_window"] = 4; c.erase("use_sliding_window"); }), (W{0, 0, 0}));
  EXPECT_EQ(windows("qwen2_bias_float32", [](auto& c) {
              c["sliding_window"] = 4;
              c["use_sliding_window"] = true;
              c["max_window_layers"] = 1;
              c.erase("layer_types");  // transformers >= 4.53 saves the list (here all full_attention)
            }),
            (W{0, 4, 4}));
  EXPECT_EQ(windows("qwen3_qknorm_float32", [](auto& c) {
              c["sliding_window"] = 5;
              c["use_sliding_window"] = true;
              c["max_window_layers"] = 0;
              c.erase("layer_types");
            }),
            (W{5, 5, 5}));
  EXPECT_EQ(windows("mistral_float32", [](auto& c) {
              c["sliding_window"] = 4;
              c["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
            }),
            (W{4, 0, 4}));
  // Booleans that are not booleans are refused by name (a "true" string used to read as false).
  ModelFile m = load_model(hf + "qwen2_bias_float32");
  m.metadata["hf.config"]["tie_word_embeddings"] = "true";
  EXPECT_TRUE(has(test::error_of([&] { build_graph(m, {16, false}); }), "tie_word_embeddings must be true or false, got \"true\""));
  m.metadata["hf.config"]["tie_word_embeddings"] = false;
  m.metadata["hf.config"]["use_sliding_window"] = 1;
  EXPECT_TRUE(has(test::error_of([&] { build_graph(m, {16, false}); }), "use_sliding_window must be true or false, got 1"));
}

TEST(HfGemma3, LayerTypesRopeParametersAndRefusals) {
  const std::string dir = kData + "gemma3/hf";
  ModelFile m = load_model(dir);
  LayerView v = layers(build_graph(m, {32, false}));
  EXPECT_EQ(v.window, (std::vector<int64_t>{8, 8, 8, 8, 8, 0}));  // (i + 1) % sliding_window_pattern
  EXPECT_EQ(v.theta, (std::vector<double>{1e4, 1e4, 1e4, 1e4, 1e4, 1e6}));
  auto& c = m.metadata["hf.config"];
  c["layer_types"] = {"full_attention",    "sliding_attention", "full_attention",
                      "sliding_attention", "sliding_attention", "full_attention"};
  // transformers >= 5: a RoPE entry per layer type.
  c.erase("rope_theta");
  c.erase("rope_local_base_freq");
  c.erase("rope_scaling");
  c["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 2e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 3e4}}}};
  Graph g = build_graph(m, {32, false});
  v = layers(g);
  EXPECT_EQ(v.window, (std::vector<int64_t>{0, 8, 0, 8, 8, 0}));
  EXPECT_EQ(v.theta, (std::vector<double>{2e6, 3e4, 2e6, 3e4, 3e4, 2e6}));
  for (const Node& n : g.nodes) {
    if (n.op == Op::rope) {
      EXPECT_EQ(n.attr_str("scaling", "none"), n.attr_float("theta") == 2e6 ? "linear" : "none") << n.name;
    }
  }
  auto error = [&](const std::function<void(nlohmann::ordered_json&)>& edit) {
    ModelFile e = load_model(dir);
    edit(e.metadata["hf.config"]);
    return test::error_of([&] { build_graph(e, {32, false}); });
  };
  EXPECT_TRUE(
      has(error([](auto& c) { c["final_logit_softcapping"] = 30.0; }), "final_logit_softcapping is not supported"));
  EXPECT_TRUE(has(error([](auto& c) { c["layer_types"] = {"sliding_attention"}; }), "one type per layer (6 layers)"));
  EXPECT_TRUE(has(error([](auto& c) { c["use_bidirectional_attention"] = true; }), "use_bidirectional_attention"));
  // The context is not capped at the window (it is applied per layer).
  EXPECT_EQ(read_hparams(m).n_ctx_train, 128);
}

// A multimodal Gemma 3 directory (model_type gemma3: text_config holding only what differs from
// Gemma3TextConfig's defaults, tensors under `prefix`, a vision tensor) made from the gemma3_text
// fixture reads as that fixture: same graph inputs, same logits.
TEST(HfGemma3, MultimodalCheckpointReadsAsItsTextModel) {
  const std::string src = kData + "gemma3/hf";
  std::ifstream cin(src + "/config.json");
  const auto text_full = nlohmann::ordered_json::parse(cin);
  std::ifstream sin(src + "/model.safetensors", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(sin)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::ordered_json::parse(bytes.substr(8, n));
  const std::string data = bytes.substr(8 + n);
  ModelFile text = load_model(src);
  const std::vector<int32_t> ids = {5, 17, 99, 3, 64, 120, 7, 8, 9, 10, 11, 12};
  auto run = [&](const ModelFile& m) {
    auto b = make_backend("cpu", build_graph(m, {16, false}), m, {});
    return b->forward(ids, 0);
  };
  const std::vector<float> want = run(text);
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    const auto dir = std::filesystem::temp_directory_path() / ("mk_gemma3_mm_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    for (const auto& [k, v] : header.items()) h[k == "__metadata__" ? k : prefix + k.substr(6)] = v;  // "model." -> prefix
    const uint64_t end = data.size();
    h["vision_tower.patch_embedding.weight"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {end, end + 8}}};
    std::string hs = h.dump();
    hs.append((8 - hs.size() % 8) % 8, ' ');
    const uint64_t hn = hs.size();
    std::ofstream(dir / "model.safetensors", std::ios::binary)
        << std::string(reinterpret_cast<const char*>(&hn), 8) << hs << data << std::string(8, '\0');
    nlohmann::ordered_json tc = text_full;  // drop what equals Gemma3TextConfig's defaults, as save_pretrained does
    tc.erase("rope_local_base_freq");
    tc.erase("rope_theta");
    tc["model_type"] = "gemma3_text";
    tc.erase("tie_word_embeddings");
    nlohmann::ordered_json mm = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                                 {"model_type", "gemma3"},
                                 {"text_config", tc},
                                 {"vision_config", {{"model_type", "siglip_vision_model"}}},
                                 {"tie_word_embeddings", true}};
    std::ofstream(dir / "config.json") << mm.dump(2);
    ModelFile m = load_model(dir.string());
    EXPECT_EQ(m.get_str("general.architecture"), "gemma3_text");
    EXPECT_EQ(layers(build_graph(m, {16, false})).theta, (std::vector<double>{1e4, 1e4, 1e4, 1e4, 1e4, 1e6}));
    EXPECT_EQ(run(m), want) << prefix;
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace mk
