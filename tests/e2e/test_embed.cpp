// Embeddings (runtime/embed.h) against llama.cpp's (tests/data/embeddings/gen_embeddings.py:
// llama-cpp-python 0.3.16, each input alone, f32 KV cache): stories260K (f32 weights) and a tiny
// llama quantized to Q3_K_M (8-bit activations as llama.cpp's), pooling mean /
// cls / last / none, normalized or not. All inputs go to embed() at once (several sequences a step,
// a 300-token input across two steps) and one at a time: the same bits. The embedding graph's rows
// are the hidden state the classifier reads: times the output matrix they give the logits graph's
// logits. cuda-emu (the device code) and reference give the same vectors; the CLI's `embed` reads
// the texts to llama.cpp's ids and prints its vectors; its errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "support/error.h"
#include "runtime/embed.h"
#include "support/cli.h"
#include "support/compare.h"
#include "support/errors.h"
#include "support/gguf_write.h"

namespace mk {
namespace {

const nlohmann::json& expected() {
  static const nlohmann::json j = test::read_json(std::string(MK_SOURCE_DIR) + "/tests/data/embeddings/expected.json");
  return j;
}
const nlohmann::json& model_case(const std::string& name) {
  for (const auto& m : expected().at("models"))
    if (m.at("name") == name) return m;
  throw std::runtime_error("no model " + name);
}
std::string model_path(const nlohmann::json& m) {
  const std::string rel = m.at("path");
  return (rel.rfind("tests/", 0) == 0 ? std::string(MK_SOURCE_DIR) : std::string(MK_SHARED_DIR)) + "/" + rel;
}
std::vector<std::vector<int32_t>> inputs_of(const nlohmann::json& m) { return m.at("inputs").get<std::vector<std::vector<int32_t>>>(); }

// One input's expected vector, rows flattened (pooling none).
std::vector<float> flat(const nlohmann::json& e) {
  std::vector<float> r;
  if (e.at(0).is_array())
    for (const auto& row : e)
      for (const auto& v : row) r.push_back(v.get<float>());
  else
    for (const auto& v : e) r.push_back(v.get<float>());
  return r;
}

EmbedOptions opts(Pooling pooling, bool normalize) {
  EmbedOptions o;
  o.pooling = pooling;
  o.normalize = normalize;
  return o;
}

struct Loaded {
  ModelFile m;
  Graph g;
  std::unique_ptr<Backend> b;
};
std::unique_ptr<Loaded> load(const std::string& path, int64_t n_ctx, const std::string& backend, bool embeddings = true) {
  auto l = std::make_unique<Loaded>();
  l->m = load_model(path);
  BuildOptions bo{n_ctx, /*all_logits=*/!embeddings};
  bo.embeddings = embeddings;
  l->g = build_graph(l->m, bo);
  BackendOptions o;
  o.threads = 2;
  if (backend == "cpu") o.kv_type = "f32";  // as the oracle's
  l->b = make_backend(backend, l->g, l->m, o);
  return l;
}

struct EmbedCase {
  std::string model;
  double tol;  // rel L2 of each vector against llama.cpp's
};

class E2EEmbed : public testing::TestWithParam<EmbedCase> {};

TEST_P(E2EEmbed, CpuEqualsLlamaCppForEveryPoolingBatchedOrNot) {
  const nlohmann::json& m = model_case(GetParam().model);
  auto l = load(model_path(m), m.at("n_ctx"), "cpu");
  const auto inputs = inputs_of(m);
  const int64_t n_embd = read_hparams(l->m).n_embd;
  for (const auto& c : m.at("cases")) {
    const std::string pooling = c.at("pooling");
    SCOPED_TRACE(pooling + (c.at("normalize").get<bool>() ? " normalized" : " raw"));
    const EmbedOptions eo = opts(pooling_from_name(pooling), c.at("normalize").get<bool>());
    const auto all = embed(*l->b, n_embd, m.at("n_ctx"), read_hparams(l->m).n_vocab, inputs, eo);
    ASSERT_EQ(all.size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::vector<float> want = flat(c.at("embeddings").at(i));
      ASSERT_EQ(all[i].size(), want.size()) << "input " << i;
      EXPECT_LT(test::rel_l2(all[i], want), GetParam().tol) << "input " << i;
      if (eo.normalize && eo.pooling != Pooling::none) {
        double ss = 0;
        for (float v : all[i]) ss += static_cast<double>(v) * v;
        EXPECT_NEAR(ss, 1.0, 1e-5) << "input " << i;
      }
      // alone: the same bits as in the batch
      const auto one = embed(*l->b, n_embd, m.at("n_ctx"), read_hparams(l->m).n_vocab,
                             std::span<const std::vector<int32_t>>(&inputs[i], 1), eo);
      EXPECT_EQ(one.at(0), all[i]) << "input " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, E2EEmbed,
                         testing::Values(EmbedCase{"stories260K", 1e-5}, EmbedCase{"tiny-q3_k_m", 1e-5}),
                         [](const auto& info) { return info.param.model == "stories260K" ? std::string("stories260K") : std::string("tiny_q3_k_m"); });

TEST(E2EEmbedGraph, RowsTimesTheClassifierAreTheLogits) {
  const nlohmann::json& m = model_case("stories260K");
  const std::vector<int32_t> ids = inputs_of(m).at(1);
  auto e = load(model_path(m), 64, "reference");
  auto lg = load(model_path(m), 64, "reference", /*embeddings=*/false);
  const Hparams hp = read_hparams(e->m);
  const auto rows = embed(*e->b, hp.n_embd, 64, hp.n_vocab, std::span<const std::vector<int32_t>>(&ids, 1), opts(Pooling::none, false));
  const std::vector<float> logits = lg->b->forward(ids, 0);
  ASSERT_EQ(rows.at(0).size(), ids.size() * static_cast<size_t>(hp.n_embd));
  ASSERT_EQ(logits.size(), ids.size() * static_cast<size_t>(hp.n_vocab));
  const WeightTensor* w = e->m.find("output.weight");
  if (!w) w = &e->m.get("token_embd.weight");
  ASSERT_EQ(w->dtype, DType::F32);
  const float* W = reinterpret_cast<const float*>(w->data);
  std::vector<float> product;
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t v = 0; v < hp.n_vocab; ++v) {
      double s = 0;
      for (int64_t k = 0; k < hp.n_embd; ++k) s += static_cast<double>(rows[0][t * hp.n_embd + k]) * W[v * hp.n_embd + k];
      product.push_back(static_cast<float>(s));
    }
  EXPECT_LT(test::rel_l2(product, logits), 1e-6);
}

TEST(E2EEmbedBackends, CudaEmuAndReferenceGiveCpusVectors) {
  const nlohmann::json& m = model_case("stories260K");
  const auto inputs = inputs_of(m);
  const std::vector<std::vector<int32_t>> some(inputs.begin(), inputs.begin() + 3);
  for (const std::string backend : {"reference", "cuda-emu"}) {
    SCOPED_TRACE(backend);
    auto l = load(model_path(m), m.at("n_ctx"), backend);
    const Hparams hp = read_hparams(l->m);
    for (const auto& c : m.at("cases")) {
      if (c.at("pooling") != "mean" && c.at("pooling") != "last") continue;
      const auto got = embed(*l->b, hp.n_embd, m.at("n_ctx"), hp.n_vocab, some, opts(pooling_from_name(c.at("pooling").get<std::string>()), c.at("normalize").get<bool>()));
      for (size_t i = 0; i < some.size(); ++i) EXPECT_LT(test::rel_l2(got[i], flat(c.at("embeddings").at(i))), 1e-5) << "input " << i;
    }
  }
}

TEST(E2EEmbedErrors, BadInputsAreNamed) {
  const nlohmann::json& m = model_case("stories260K");
  auto l = load(model_path(m), 16, "cpu");
  const Hparams hp = read_hparams(l->m);
  auto error = [&](std::vector<std::vector<int32_t>> in) { return test::error_of([&] { embed(*l->b, hp.n_embd, 16, hp.n_vocab, in, {}); }); };
  EXPECT_EQ(error({{1, 2}, {}}), "input 1: no tokens to embed");
  EXPECT_EQ(error({std::vector<int32_t>(17, 5)}), "input 0: 17 tokens are more than the context length 16");
  EXPECT_EQ(error({{1, 2}, {1, 512}}), "input 1: token 512 (at 1) is not an id of the vocabulary [0, 512)");
  EXPECT_EQ(error({{1, -1}}), "input 0: token -1 (at 1) is not an id of the vocabulary [0, 512)");
  // 16 tokens fill the 16-row pool: the inputs go one group after another
  const auto v = embed(*l->b, hp.n_embd, 16, hp.n_vocab, std::vector<std::vector<int32_t>>{std::vector<int32_t>(16, 7), {1, 7}, {1, 7}}, {});
  EXPECT_EQ(v.at(1), v.at(2));
  EXPECT_THROW(pooling_from_name("max"), Error);
  // before_step runs before each step; what it throws ends embed() (a server's deadline, shutdown)
  EmbedOptions o;
  int calls = 0;
  o.before_step = [&] {
    if (++calls == 2) throw std::runtime_error("stop here");
  };
  auto big = load(model_path(m), 512, "cpu");
  const std::vector<std::vector<int32_t>> long_input = {std::vector<int32_t>(300, 7)};  // two steps of 256 rows
  EXPECT_THROW(embed(*big->b, hp.n_embd, 512, hp.n_vocab, long_input, o), std::runtime_error);
  EXPECT_EQ(calls, 2);
}

TEST(E2EEmbedCli, TextsGiveLlamaCppsIdsAndVectors) {
  const nlohmann::json& m = model_case("stories260K");
  std::string args = "embed -m " + model_path(m) + " -t 2";
  for (size_t i = 0; i < 3; ++i) args += " -p '" + m.at("texts").at(i).get<std::string>() + "'";
  int status = -1;
  std::string err;
  const std::string out = test::run_cli(args, &status, &err);
  ASSERT_EQ(status, 0) << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("pooling"), "mean");  // the GGUF names none
  EXPECT_EQ(j.at("normalized"), true);
  EXPECT_EQ(j.at("dimensions"), 64);
  ASSERT_EQ(j.at("data").size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(j["data"][i].at("index"), i);
    EXPECT_EQ(j["data"][i].at("n_tokens"), m.at("inputs").at(i).size());
    EXPECT_LT(test::rel_l2(j["data"][i].at("embedding").get<std::vector<float>>(), flat(m.at("cases").at(0).at("embeddings").at(i))), 1e-5);
  }
  // --ids, pooling none: one row per token
  const std::string ids_out = test::run_cli("embed -m " + model_path(m) + " --ids 1,403,407 --pooling none", &status, &err);
  ASSERT_EQ(status, 0) << err;
  const nlohmann::json k = nlohmann::json::parse(ids_out);
  EXPECT_EQ(k.at("pooling"), "none");
  EXPECT_EQ(k["data"][0].at("embedding").size(), 3u);
  EXPECT_EQ(k["data"][0]["embedding"][2].size(), 64u);
  // --dimensions: the first values of each row, each row normalized again
  const nlohmann::json d = nlohmann::json::parse(
      test::run_cli("embed -m " + model_path(m) + " --ids 1,403,407 --pooling none --dimensions 5", &status, &err));
  ASSERT_EQ(status, 0) << err;
  EXPECT_EQ(d.at("dimensions"), 5);
  ASSERT_EQ(d["data"][0]["embedding"].size(), 3u);
  for (size_t r = 0; r < 3; ++r) {
    const std::vector<float> full = k["data"][0]["embedding"][r].get<std::vector<float>>(), got = d["data"][0]["embedding"][r];
    double ss = 0;
    for (size_t i = 0; i < 5; ++i) ss += static_cast<double>(full[i]) * full[i];
    ASSERT_EQ(got.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], full[i] / std::sqrt(ss), 1e-6) << r << " " << i;
  }
}

TEST(E2EEmbedCli, ErrorsAreNamed) {
  const std::string model = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";
  int status = -1;
  std::string out = test::run_cli("embed -m " + model, &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("embed needs its input: -p TEXT, -f FILE or --ids ID,..."), std::string::npos) << out;
  out = test::run_cli("embed -m " + model + " -p hi --pooling max", &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("--pooling"), std::string::npos) << out;
  out = test::run_cli("embed -m " + model + " -c 4 -p 'Once upon a time there was'", &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("-p: 7 tokens are more than the context length 4 (-c)"), std::string::npos) << out;
  out = test::run_cli("embed -m " + model + " -p Once -p ''", &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("-p #2: the text is empty"), std::string::npos) << out;
  out = test::run_cli("embed -m " + model + " --ids 1,2 --dimensions 65", &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("--dimensions 65 is more than the model's 64 (n_embd)"), std::string::npos) << out;
  out = test::run_cli("embed -m " + model + " --ids 1,600", &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("token 600 (at 1) is not an id of the vocabulary [0, 512)"), std::string::npos) << out;
  const std::string empty = (std::filesystem::path(testing::TempDir()) / "mk_embed_empty.txt").string();
  std::ofstream(empty) << "\n\n";
  out = test::run_cli("embed -m " + model + " -f " + empty, &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find(empty + ": no non-empty line to embed"), std::string::npos) << out;
  std::ofstream(empty) << "Once\n\nOnce upon a time there was a girl\n";  // line 3 is too long for -c 6
  out = test::run_cli("embed -m " + model + " -c 6 -f " + empty, &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find(empty + " line 3: 11 tokens are more than the context length 6 (-c)"), std::string::npos) << out;
  std::filesystem::remove(empty);
}

// A GGUF that names its pooling (embedding models: Qwen3-Embedding's qwen3.pooling_type = 3) loads,
// embeds with it by default, and still generates (trial 51: every such file was refused).
TEST(E2EEmbedCli, GgufPoolingTypeIsTheDefault) {
  const nlohmann::json& m = model_case("stories260K");
  ModelFile f = load_model(model_path(m));
  f.metadata["llama.pooling_type"] = 3;
  const std::string path = (std::filesystem::path(testing::TempDir()) / "mk_pooling_last.gguf").string();
  test::write_gguf(f, path);
  int status = -1;
  std::string err;
  const std::string out = test::run_cli("embed -m " + path + " -p '" + m.at("texts").at(1).get<std::string>() + "'", &status, &err);
  ASSERT_EQ(status, 0) << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("pooling"), "last");
  EXPECT_LT(test::rel_l2(j["data"][0].at("embedding").get<std::vector<float>>(), flat(m.at("cases").at(2).at("embeddings").at(1))), 1e-5);
  test::run_cli("run -m " + path + " -p hi -n 4", &status, &err);
  EXPECT_EQ(status, 0) << err;
  f.metadata["llama.pooling_type"] = 4;
  test::write_gguf(f, path);
  test::run_cli("embed -m " + path + " -p hi", &status, &err);
  EXPECT_EQ(status, 1);
  EXPECT_NE(err.find("llama.pooling_type is 4 (rank: a reranker's score), which is not supported; --pooling picks another"), std::string::npos) << err;
  test::run_cli("embed -m " + path + " -p hi --pooling mean", &status, &err);
  EXPECT_EQ(status, 0) << err;
  std::filesystem::remove(path);
}

TEST(EmbedPooling, ModelFileNamesItsPooling) {
  ModelFile g;
  g.format = "gguf";
  g.path = "m.gguf";
  EXPECT_EQ(model_pooling(g), Pooling::mean);  // names none
  g.metadata["general.architecture"] = "qwen3";
  for (const auto& [v, p] : {std::pair{0, Pooling::none}, {1, Pooling::mean}, {2, Pooling::cls}, {3, Pooling::last}}) {
    g.metadata["qwen3.pooling_type"] = v;
    EXPECT_EQ(model_pooling(g), p) << v;
  }
  g.metadata["qwen3.pooling_type"] = 4;
  EXPECT_EQ(test::error_of([&] { model_pooling(g); }), "m.gguf: qwen3.pooling_type is 4 (rank: a reranker's score), which is not supported; --pooling picks another");
  g.metadata["qwen3.pooling_type"] = 9;
  EXPECT_EQ(test::error_of([&] { model_pooling(g); }), "m.gguf: qwen3.pooling_type is 9, expected 0 (none), 1 (mean), 2 (cls) or 3 (last)");

  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "mk_embed_pooling";
  std::filesystem::create_directories(dir / "1_Pooling");
  ModelFile h;
  h.format = "hf";
  h.path = dir.string();
  const std::string cfg = (dir / "1_Pooling" / "config.json").string();
  auto write = [&](const std::string& text) { std::ofstream(cfg) << text; };
  write(R"({"word_embedding_dimension": 1024, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": false, "pooling_mode_lasttoken": true})");
  EXPECT_EQ(model_pooling(h), Pooling::last);  // Qwen3-Embedding's
  write(R"({"pooling_mode_cls_token": true})");
  EXPECT_EQ(model_pooling(h), Pooling::cls);
  write(R"({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true})");
  EXPECT_EQ(test::error_of([&] { model_pooling(h); }), cfg + ": more than one pooling mode is on (their vectors would be concatenated); --pooling picks one");
  write(R"({"pooling_mode_max_tokens": true})");
  EXPECT_EQ(test::error_of([&] { model_pooling(h); }), cfg + ": pooling_mode_max_tokens is not supported (mean, cls and last are); --pooling picks one");
  write(R"({"pooling_mode_lasttoken": "yes"})");
  EXPECT_EQ(test::error_of([&] { model_pooling(h); }), cfg + ": pooling_mode_lasttoken must be true or false");
  write("{");
  EXPECT_THROW(model_pooling(h), Error);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(model_pooling(h), Pooling::mean);  // no sentence-transformers folder
}

}  // namespace
}  // namespace mk
