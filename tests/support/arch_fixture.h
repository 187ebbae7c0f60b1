// The llama.cpp-oracle fixtures of tests/data/<family>/ (gen_<family>.py: a tiny random model as GGUF
// and HF directory, and llama.cpp's logits at every position of a prompt in expected.json) and the
// checks every family's test runs on them: logits of the prompt at once and of prefill + one-token
// steps against llama.cpp's, and variants of the GGUF with a tensor dropped or metadata changed.
#pragma once
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "archs/arch.h"
#include "backend/backend.h"
#include "model/model_file.h"
#include "support/compare.h"
#include "support/error.h"
#include "support/gguf_write.h"

namespace mk::test {

struct ArchFixture {
  std::string dir;                        // MK_SOURCE_DIR/tests/data/<family>/
  std::vector<int32_t> prompt;            // expected.json prompt_ids
  std::vector<std::vector<float>> logits;  // llama.cpp's, [n_tokens][n_vocab]
  nlohmann::json expected;                // the whole file (a family's own fields)
};

// tests/data/<family>/expected.json, read once.
inline const ArchFixture& arch_fixture(const std::string& family) {
  static std::map<std::string, ArchFixture> cache;
  auto it = cache.find(family);
  if (it == cache.end()) {
    ArchFixture f;
    f.dir = std::string(MK_SOURCE_DIR) + "/tests/data/" + family + "/";
    f.expected = nlohmann::json::parse(std::ifstream(f.dir + "expected.json"));
    f.prompt = f.expected.at("prompt_ids").get<std::vector<int32_t>>();
    f.logits = f.expected.at("logits").get<std::vector<std::vector<float>>>();
    it = cache.emplace(family, std::move(f)).first;
  }
  return it->second;
}

// The logits at every position of the fixture's prompt, run at once; an f32 KV cache as the oracle's.
inline std::vector<float> fixture_logits(const std::string& model_path, const ArchFixture& f, const std::string& backend,
                                         const std::string& act_quant = "auto", int64_t n_ctx = 64) {
  ModelFile m = load_model(model_path);
  Graph g = build_graph(m, {n_ctx, true});
  BackendOptions bo;
  bo.threads = 2;
  bo.kv_type = "f32";
  bo.act_quant = act_quant;
  return make_backend(backend, g, m, bo)->forward(f.prompt, 0);
}

// Checks fixture_logits against llama.cpp's: rel L2 below `tol`, every row's argmax the same.
inline void expect_fixture_logits(const std::string& model_path, const ArchFixture& f, const std::string& backend, double tol) {
  const std::vector<float> got = fixture_logits(model_path, f, backend);
  const std::vector<float> want = flat_rows(f.logits);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(rel_l2(got, want), tol) << backend;
  const int64_t n_vocab = static_cast<int64_t>(f.logits[0].size());
  EXPECT_EQ(argmax_rows(got, n_vocab), argmax_rows(want, n_vocab)) << backend;
}

// The first `n_prefill` prompt tokens in one step, then one token per step (the decode path): the
// logits of rows n_prefill - 1 on against llama.cpp's, rel L2 below `tol`.
inline void expect_stepped_logits(const std::string& model_path, const ArchFixture& f, const std::string& backend, double tol,
                                  size_t n_prefill = 5, int64_t n_ctx = 64) {
  ModelFile m = load_model(model_path);
  Graph g = build_graph(m, {n_ctx, false});
  BackendOptions bo;
  bo.threads = 2;
  bo.kv_type = "f32";
  auto b = make_backend(backend, g, m, bo);
  std::vector<float> got = b->forward(std::span<const int32_t>(f.prompt.data(), n_prefill), 0);
  for (size_t p = n_prefill; p < f.prompt.size(); ++p) {
    std::vector<float> l = b->forward(std::span<const int32_t>(f.prompt.data() + p, 1), static_cast<int64_t>(p));
    got.insert(got.end(), l.begin(), l.end());
  }
  EXPECT_LT(rel_l2(got, flat_rows(f.logits, n_prefill - 1)), tol) << backend;
}

// A copy of the GGUF at `path` as stored (no load-time views), without tensor `drop` ("" = none) and
// with `change` applied, written to a temporary file of its own; returns its path.
inline std::string gguf_variant(const std::string& path, const std::string& drop, const std::function<void(ModelFile&)>& change = {}) {
  static std::atomic<int> n{0};
  ModelFile raw = load_gguf(path), m;
  m.path = raw.path;
  m.format = raw.format;
  m.metadata = raw.metadata;
  for (const WeightTensor& t : raw.tensors())
    if (t.name != drop) m.add_tensor(t);
  if (change) change(m);
  const std::string out = (std::filesystem::path(testing::TempDir()) /
                           (std::filesystem::path(path).stem().string() + "_variant" + std::to_string(n++) + ".gguf"))
                              .string();
  write_gguf(m, out);
  static struct Files {  // removed at exit
    std::vector<std::string> paths;
    ~Files() {
      for (const auto& p : paths) std::filesystem::remove(p);
    }
  } files;
  files.paths.push_back(out);
  return out;
}

// What loading `path` and building its graph throws (mk::Error's text), or "" when it builds.
inline std::string build_error(const std::string& path, int64_t n_ctx = 64) {
  try {
    ModelFile m = load_model(path);
    build_graph(m, {n_ctx, false});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The three backends the families' logits are checked on, named for gtest (cuda-emu: cuda_emu).
inline std::string backend_test_name(const testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

}  // namespace mk::test
