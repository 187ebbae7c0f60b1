// Seeded mutation fuzzing of every loader (issue 10): a deterministic driver per loader mutates a
// real input (bytes for GGUF, llama2.c and safetensors; JSON-aware edits for config.json and
// tokenizer.json), runs it through loading, hyperparameters, graph building and tokenizing, and
// requires that each input either works or throws mk::Error. Under the asan preset a crash, a
// sanitizer report or a hang (ctest timeout) fails the run; a stray exception of another type fails
// the test with the seed and iteration that reproduce it.
//
// Bounded for CI (a few hundred inputs per loader, seconds). For a longer campaign:
//   MK_FUZZ_ITERATIONS=20000 MK_FUZZ_SEED=7 build-asan/tests/mk_tests --gtest_filter='Fuzz*'
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <random>
#include <sstream>

#include "archs/arch.h"
#include "model/hf.h"
#include "model/model_file.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "support/error.h"
#include "support/json.h"
#include "support/mmap.h"
#include "support/cli.h"

namespace mk {
namespace {

const std::string kShared = std::string(MK_SHARED_DIR);

uint64_t env_u64(const char* name, uint64_t def) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : def;
}
int iterations(int def) { return static_cast<int>(env_u64("MK_FUZZ_ITERATIONS", static_cast<uint64_t>(def))); }
uint64_t seed() { return env_u64("MK_FUZZ_SEED", 1); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Byte-level mutations, biased to the values that break size arithmetic.
class ByteMutator {
 public:
  explicit ByteMutator(uint64_t seed) : rng_(seed) {}

  std::string mutate(std::string s, size_t hot_prefix) {
    const int n_edits = 1 + static_cast<int>(rng_() % 4);
    for (int e = 0; e < n_edits && !s.empty(); ++e) {
      // Most edits land in the header/metadata (the first hot_prefix bytes), where parsing happens.
      const size_t span = std::min(s.size(), std::max<size_t>(hot_prefix, 1));
      const size_t at = rng_() % span;
      switch (rng_() % 7) {
        case 0: s[at] = static_cast<char>(s[at] ^ (1u << (rng_() % 8))); break;
        case 1: s[at] = static_cast<char>(kBytes[rng_() % std::size(kBytes)]); break;
        case 2: {  // an interesting 64-bit (or 32-bit) value
          const uint64_t v = kWords[rng_() % std::size(kWords)];
          const size_t w = rng_() % 2 ? 8 : 4;
          if (at + w <= s.size()) std::memcpy(s.data() + at, &v, w);
          break;
        }
        case 3: s.resize(at); break;  // truncate
        case 4: s.insert(at, s.substr(at, std::min<size_t>(rng_() % 64, s.size() - at))); break;
        case 5: s.erase(at, std::min<size_t>(rng_() % 16 + 1, s.size() - at)); break;
        case 6: s.insert(at, 1, static_cast<char>(rng_())); break;
      }
    }
    return s;
  }

 private:
  static constexpr uint8_t kBytes[] = {0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff, '{', '"', '['};
  static constexpr uint64_t kWords[] = {0,           1,           0xffffffffull, 0x80000000ull, 0x7fffffffull,
                                        1ull << 32,  1ull << 62,  1ull << 63,    ~0ull,         (1ull << 63) - 1,
                                        0x100000001ull, 4096};
  std::mt19937_64 rng_;
};

// JSON-text mutations: numbers replaced by extremes, strings emptied or grown, deep nesting,
// duplicated members, deleted characters.
class JsonMutator {
 public:
  explicit JsonMutator(uint64_t seed) : rng_(seed) {}

  std::string mutate(std::string s) {
    const int n_edits = 1 + static_cast<int>(rng_() % 3);
    for (int e = 0; e < n_edits && !s.empty(); ++e) {
      const size_t at = rng_() % s.size();
      switch (rng_() % 6) {
        case 0: {  // the number at or after `at` becomes an extreme one
          size_t b = s.find_first_of("-0123456789", at);
          if (b == std::string::npos) break;
          size_t end = s.find_first_not_of("-+.eE0123456789", b);
          s.replace(b, (end == std::string::npos ? s.size() : end) - b, kNumbers[rng_() % std::size(kNumbers)]);
          break;
        }
        case 1: {  // the string at or after `at` becomes empty, or long
          size_t b = s.find('"', at);
          if (b == std::string::npos) break;
          size_t end = s.find('"', b + 1);
          if (end == std::string::npos) break;
          s.replace(b + 1, end - b - 1, rng_() % 2 ? "" : std::string(4096, 'x'));
          break;
        }
        case 2: {  // a value wrapped in deep nesting
          size_t b = s.find(':', at);
          if (b == std::string::npos) break;
          const size_t depth = rng_() % 3 == 0 ? 20000 : 1 + rng_() % 100;
          s.insert(b + 1, std::string(depth, '['));
          size_t end = s.find_first_of(",}", b + 1 + depth);
          s.insert(end == std::string::npos ? s.size() : end, std::string(depth, ']'));
          break;
        }
        case 3: {  // a member given twice
          size_t b = s.find(",\"", at);
          if (b == std::string::npos) break;
          size_t end = s.find_first_of(",}", s.find(':', b + 1));
          if (end == std::string::npos) break;
          s.insert(end, s.substr(b, end - b));
          break;
        }
        case 4: s.erase(at, 1); break;
        case 5: s.insert(at, 1, "{}[]\",:0"[rng_() % 8]); break;
      }
    }
    return s;
  }

 private:
  static constexpr const char* kNumbers[] = {"0",  "-1", "1", "2147483648", "4611686018427387904", "9223372036854775807",
                                             "9223372036854775808", "18446744073709551615", "1e308", "-1e308",
                                             "1e-320", "0.5", "65536", "3"};
  std::mt19937_64 rng_;
};

// Runs f on each input; mk::Error is the only acceptable failure. Counts the inputs that went
// through without error (the campaign must reach past the first checks) and those refused.
struct Tally {
  int ok = 0, refused = 0;
};
template <class F>
void expect_only_mk_errors(const char* loader, int i, F&& f, Tally* tally = nullptr) {
  try {
    f();
    if (tally) ++tally->ok;
  } catch (const Error&) {
    if (tally) ++tally->refused;
  } catch (const std::exception& e) {
    ADD_FAILURE() << loader << ": seed " << seed() << " iteration " << i << ": " << typeid(e).name() << ": "
                  << std::string(e.what()).substr(0, 300);
  }
}

// Loading and everything the runtime does before the first forward: hyperparameters, the graph
// (small context), the tokenizer and a short encode/decode.
void exercise_model(const ModelFile& m) {
  read_hparams(m);
  build_graph(m, BuildOptions{16, false});
}
void exercise_tokenizer(const Tokenizer& t) {
  for (const char* text : {"hello world", " Once upon a time", "\xC3\xA9t\xC3\xA9 \xE2\x96\x81x", ""}) {
    std::vector<int32_t> ids = t.encode_prompt(text);
    for (int32_t id : ids) t.token_bytes(-1, id);
  }
}

TEST(FuzzGguf, MutatedStories260K) {
  const std::string base = read_file(kShared + "/models/stories260K/stories260K.gguf");
  ByteMutator mut(seed());
  Tally tally;
  for (int i = 0; i < iterations(300); ++i) {
    std::string bytes = mut.mutate(base, 24 * 1024);  // metadata (vocab) and tensor infos
    expect_only_mk_errors("gguf", i, [&] {
      ModelFile m = load_gguf(MappedFile::from_bytes(std::move(bytes), "fuzz.gguf"));
      exercise_model(m);
      exercise_tokenizer(*load_model_tokenizer(m));
    }, &tally);
  }
  EXPECT_GT(tally.ok, 0);
  EXPECT_GT(tally.refused, 0);
}

// The llama.cpp-oracle family fixtures (tests/data/<family>: fused q/k/v views, LayerNorm keys,
// multipliers, layers without RoPE, parallel layers) with their metadata and tensor infos mutated.
TEST(FuzzGguf, MutatedFamilyFixtures) {
  ByteMutator mut(seed());
  Tally tally;
  for (const char* file : {"gpt2/gpt2-tiny.f32.gguf", "phi2/phi2-fused-qkv.f32.gguf", "smollm3/smollm3-tiny.f32.gguf",
                           "granite/granite-tiny.f32.gguf", "olmo2/olmo2-tiny.f32.gguf", "starcoder2/starcoder2-tiny.f32.gguf",
                           "stablelm/stablelm-parallel.f32.gguf", "qwen3moe/qwen3moe-tiny.f32.gguf", "qwen3moe/mixtral-tiny.f32.gguf",
                           "qwen3moe/olmoe-tiny.f32.gguf", "qwen3moe/granitemoe-tiny.f32.gguf"}) {
    const std::string base = read_file(std::string(MK_SOURCE_DIR) + "/tests/data/" + file);
    for (int i = 0; i < iterations(40); ++i) {
      std::string bytes = mut.mutate(base, 8 * 1024);
      expect_only_mk_errors(file, i, [&] {
        ModelFile m = load_gguf(MappedFile::from_bytes(std::move(bytes), "fuzz.gguf"));
        add_gguf_views(m);
        exercise_model(m);
      }, &tally);
    }
  }
  EXPECT_GT(tally.ok, 0);
  EXPECT_GT(tally.refused, 0);
}

TEST(FuzzLlama2c, MutatedStories260K) {
  const std::string base = read_file(kShared + "/models/stories260K/stories260K.bin");
  const std::string tok = read_file(kShared + "/models/stories260K/tok512.bin");
  ByteMutator mut(seed());
  Tally tally;
  for (int i = 0; i < iterations(300); ++i) {
    const bool mutate_tokenizer = i % 3 == 2;
    std::string bytes = mutate_tokenizer ? base : mut.mutate(base, 64);
    std::string tok_bytes = mutate_tokenizer ? mut.mutate(tok, tok.size()) : tok;
    expect_only_mk_errors("llama2c", i, [&] {
      ModelFile m = load_llama2c(MappedFile::from_bytes(std::move(bytes), "fuzz.bin"));
      exercise_model(m);
      exercise_tokenizer(*load_llama2c_tokenizer(MappedFile::from_bytes(std::move(tok_bytes), "tok.bin"),
                                                 static_cast<int32_t>(read_hparams(m).n_vocab)));
    }, &tally);
  }
  EXPECT_GT(tally.ok, 0);
  EXPECT_GT(tally.refused, 0);
}

TEST(FuzzSafetensors, MutatedFixtureWeights) {
  const std::string base = read_file(kShared + "/fixtures/hf/llama_gqa_float32/model.safetensors");
  uint64_t header_len = 0;
  std::memcpy(&header_len, base.data(), 8);
  ByteMutator byte_mut(seed());
  JsonMutator json_mut(seed());
  Tally tally;
  for (int i = 0; i < iterations(300); ++i) {
    std::string bytes;
    if (i % 2) {
      bytes = byte_mut.mutate(base, 8 + static_cast<size_t>(header_len));
    } else {  // JSON-aware edit of the header, length field kept consistent
      std::string h = json_mut.mutate(base.substr(8, static_cast<size_t>(header_len)));
      uint64_t n = h.size();
      bytes = std::string(reinterpret_cast<const char*>(&n), 8) + h + base.substr(8 + static_cast<size_t>(header_len));
    }
    expect_only_mk_errors("safetensors", i, [&] {
      ModelFile m;
      m.path = "fuzz";
      add_safetensors(m, MappedFile::from_bytes(std::move(bytes), "fuzz.safetensors"));
    }, &tally);
  }
  EXPECT_GT(tally.ok, 0);
  EXPECT_GT(tally.refused, 0);
}

// config.json and generation_config.json of every fixture family, mutated, over the fixture's weights.
TEST(FuzzHfConfig, MutatedConfigs) {
  JsonMutator mut(seed());
  Tally tally;
  const char* families[] = {"llama_gqa_float32", "phi3_float32", "gpt2_float32", "qwen3_qknorm_float32",
                            "gemma_float32", "llama3_scaled_tied_float32"};
  for (const char* family : families) {
    const std::string dir = kShared + "/fixtures/hf/" + family;
    const ModelFile base = load_hf_dir(dir);
    const std::string config = read_file(dir + "/config.json");
    for (int i = 0; i < iterations(60); ++i) {
      const std::string text = mut.mutate(config);
      expect_only_mk_errors(family, i, [&] {
        ModelFile m;
        m.path = dir;
        m.format = "hf";
        m.metadata = base.metadata;
        for (const auto& t : base.tensors()) m.add_tensor(t);
        nlohmann::ordered_json c = parse_json(text, "config.json");
        if (!c.is_object()) fail("config.json: not a JSON object");
        m.metadata["hf.config"] = c;
        if (c.contains("model_type") && c["model_type"].is_string())
          m.metadata["general.architecture"] = c["model_type"];
        m.metadata["hf.generation_config"] = parse_json(mut.mutate(R"({"eos_token_id": [1, 2], "bos_token_id": 1})"),
                                                        "generation_config.json");
        exercise_model(m);
        read_hf_eos_ids(m);
      }, &tally);
    }
  }
  EXPECT_GT(tally.ok, 0);
  EXPECT_GT(tally.refused, 0);
}

TEST(FuzzHfTokenizer, MutatedTokenizerJson) {
  JsonMutator mut(seed());
  Tally tally;
  for (const char* file : {"/fixtures/hf/llama_gqa_float32/tokenizer.json", "/fixtures/hf/bytelevel_bpe_tokenizer.json"}) {
    const std::string base = read_file(kShared + file);
    for (int i = 0; i < iterations(60); ++i) {
      const std::string text = mut.mutate(base);
      expect_only_mk_errors(file, i, [&] { exercise_tokenizer(*parse_hf_tokenizer_json(text, "fuzz.json")); }, &tally);
    }
  }
  EXPECT_GT(tally.ok, 0);
  EXPECT_GT(tally.refused, 0);
  std::printf("tokenizer.json: %d accepted, %d refused\n", tally.ok, tally.refused);
}

// The three kinds the first campaign found (../shared/fixtures/fuzz/README.md), built in memory:
// each is an mk::Error naming the key or file.
TEST(FuzzFindings, FixturesEndInANamedError) {
  const std::string fuzz = kShared + "/fixtures/fuzz/";
  auto error_with = [](const std::string& what, auto&& f) {
    try {
      f();
      return std::string("<no error>");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      return std::string(e.what());
    }
  };
  {  // overflow_head_dim (head_dim 2^62) over phi3_float32's config: every reader of head_dim refuses it
    nlohmann::ordered_json c = read_json_file(kShared + "/fixtures/hf/phi3_float32/config.json");
    const nlohmann::ordered_json over = read_json_file(fuzz + "overflow_head_dim/config.json");
    for (const auto& [k, v] : over.items()) c[k] = v;
    ModelFile m = load_hf_dir(kShared + "/fixtures/hf/phi3_float32");
    m.metadata["hf.config"] = c;
    error_with("config.json: head_dim = 4611686018427387904 exceeds the limit", [&] { read_hparams(m); });
    error_with("config.json: head_dim = 4611686018427387904 exceeds the limit",
               [&] { build_graph(m, BuildOptions{16, false}); });
  }
  error_with("nested deeper than", [&] { read_json_file(fuzz + "deep_nested_config/config.json"); });
  error_with("Metaspace pre_tokenizer replacement must not be empty",
             [&] { load_hf_tokenizer_json(fuzz + "metaspace_empty_replacement/tokenizer.json"); });
}

// The same through the CLI, as the README runs them: a copy of the fixture with the mutated files
// put over it; each ends with an `error:` line, exit 1, and (under the asan preset) no report.
TEST(FuzzFindings, CliOnCopiedFixtures) {
  namespace fs = std::filesystem;
  struct Case {
    const char *folder, *over, *args, *expect;
  };
  const Case cases[] = {
      {"overflow_head_dim", "phi3_float32", "logits --ids 1,2,3", "head_dim"},
      {"deep_nested_config", "qwen3_qknorm_float32", "run -p 'hello world' -n 2", "config.json: JSON nested deeper"},
      {"metaspace_empty_replacement", "llama_gqa_float32", "run -p 'hello world' -n 2", "Metaspace"},
  };
  const fs::path tmp = fs::temp_directory_path() / ("mk_fuzz_" + std::to_string(::getpid()));
  for (const Case& c : cases) {
    const fs::path dir = tmp / c.folder;
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(kShared + "/fixtures/hf/" + c.over))
      fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
    for (const auto& e : fs::directory_iterator(kShared + "/fixtures/fuzz/" + c.folder))
      fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
    const std::string cmd = "timeout 20 " + std::string(MK_CLI_PATH) + " " + c.args + " -m " + dir.string() + " 2>&1";
    int status = 0;
    const std::string out = mk::test::run_shell(cmd, &status);
    EXPECT_EQ(status, 1) << c.folder << ": " << out;
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << c.folder << ": " << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << c.folder << ": " << out;
    EXPECT_EQ(out.find("Sanitizer"), std::string::npos) << c.folder << ": " << out;
    EXPECT_EQ(out.find("runtime error"), std::string::npos) << c.folder << ": " << out;
  }
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace mk
