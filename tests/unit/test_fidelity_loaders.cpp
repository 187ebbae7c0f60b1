// Loader fidelity (issue 10): metadata that changes the result is honoured or refused by name, and
// the ../shared/fixtures/bugs rows that concern loaders hold. Suites here run in the ASan group.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "archs/arch.h"
#include "model/model_file.h"
#include "model/tokenizer.h"
#include "backend/backend.h"
#include "runtime/session.h"
#include "support/compare.h"
#include "support/mmap.h"
#include "support/errors.h"
#include "model/hf.h"

namespace mk {
namespace {

const std::string kBugs = std::string(MK_SHARED_DIR) + "/fixtures/bugs/";
const std::string kStoriesGguf = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";

// add_bos_false.gguf: tokenizer.ggml.add_bos_token = false.
TEST(TokenizerGgufFlags, AddBosFalseFixture) {
  ModelFile m = load_model(kBugs + "add_bos_false.gguf");
  auto t = load_model_tokenizer(m);
  EXPECT_FALSE(t->add_bos);
  EXPECT_EQ(t->encode_prompt("Once upon a time"), (std::vector<int32_t>{403, 407, 261, 378}));
}

TEST(TokenizerGgufFlags, AddBosAndEosFromMetadata) {
  ModelFile m = load_model(kStoriesGguf);
  auto t = load_model_tokenizer(m);  // neither key: BOS only
  EXPECT_EQ(t->encode_prompt("Once upon a time"), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  m.metadata["tokenizer.ggml.add_eos_token"] = true;
  EXPECT_EQ(load_model_tokenizer(m)->encode_prompt("Once upon a time"), (std::vector<int32_t>{1, 403, 407, 261, 378, 2}));
  m.metadata["tokenizer.ggml.add_bos_token"] = false;
  EXPECT_EQ(load_model_tokenizer(m)->encode_prompt("Once upon a time"), (std::vector<int32_t>{403, 407, 261, 378, 2}));
  m.metadata["tokenizer.ggml.add_bos_token"] = 0;  // wrong type: named
  EXPECT_NE(test::error_of([&] { load_model_tokenizer(m); }).find("tokenizer.ggml.add_bos_token is not a boolean"),
            std::string::npos);
  m.metadata["tokenizer.ggml.add_bos_token"] = true;
  m.metadata["tokenizer.ggml.eos_token_id"] = -1;
  EXPECT_NE(test::error_of([&] { load_model_tokenizer(m); }).find("add_eos_token is true but the vocab has no EOS"),
            std::string::npos);
}

std::vector<float> last_logits(const ModelFile& m, const std::vector<int32_t>& ids, const std::string& backend) {
  Graph g = build_graph(m, BuildOptions{static_cast<int64_t>(ids.size()), false});
  BackendOptions bo;
  bo.threads = 2;
  auto b = make_backend(backend, g, m, bo);
  return b->forward(ids, 0);
}

// rope_linear_x4.gguf: llama.rope.scaling.type = linear, factor 4 (positions divided by 4).
TEST(GgufKeys, RopeLinearFixtureMatchesExpectedLogits) {
  std::ifstream in(kBugs + "rope_linear_x4.expected.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  const std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  const std::vector<double> want = ref["logits_last"].get<std::vector<double>>();
  ModelFile m = load_model(kBugs + "rope_linear_x4.gguf");
  for (const char* backend : {"reference", "cpu"}) {
    EXPECT_LT(test::rel_l2(last_logits(m, ids, backend), want), 1e-4) << backend;
  }
  // The older key alone means the same; unscaled logits are far from the expectation.
  ModelFile old = load_model(kBugs + "rope_linear_x4.gguf");
  old.metadata.erase("llama.rope.scaling.type");
  old.metadata.erase("llama.rope.scaling.factor");
  EXPECT_GT(test::rel_l2(last_logits(old, ids, "cpu"), want), 1e-3) << "the fixture does not exercise scaling";
  old.metadata["llama.rope.scale_linear"] = 4.0;
  EXPECT_LT(test::rel_l2(last_logits(old, ids, "cpu"), want), 1e-4);
}

TEST(GgufKeys, EveryArchKeyIsHonouredOrRefusedByName) {
  auto error = [](const std::function<void(ModelFile&)>& edit) {
    ModelFile m = load_model(kStoriesGguf);
    edit(m);
    return test::error_of([&] { build_graph(m, BuildOptions{16, false}); });
  };
  auto has = [](const std::string& e, const std::string& part) { return e.find(part) != std::string::npos; };
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.rope.scaling.type"] = "yarn"; }),
                  "llama.rope.scaling.type = yarn is not supported"));
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.rope.scaling.type"] = "longrope"; }), "longrope"));
  EXPECT_TRUE(has(error([](ModelFile& m) {
                    m.metadata["llama.rope.scaling.type"] = "linear";
                    m.metadata["llama.rope.scaling.factor"] = 2.0;
                    m.metadata["llama.rope.scale_linear"] = 4.0;
                  }),
                  "disagree"));
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.rope.scaling.type"] = "linear"; }),
                  "llama.rope.scaling.factor is missing"));
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.rope.scaling.attn_factor"] = -0.5; }),
                  "llama.rope.scaling.attn_factor = -0.5 must be a positive number"));
  // llama reads experts (Mixtral): a count needs the experts used per token and expert tensors, not dense ones.
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.expert_count"] = 8u; }), "missing metadata key llama.expert_used_count"));
  EXPECT_TRUE(has(error([](ModelFile& m) {
                    m.metadata["llama.expert_count"] = 8u;
                    m.metadata["llama.expert_used_count"] = 2u;
                  }),
                  "blk.0.ffn_gate.weight: a dense feed-forward among the expert layers is not supported"));
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.expert_used_count"] = 2u; }), "without experts"));
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.attention.causal"] = false; }), "non-causal"));
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.logit_scale"] = 0.5; }), "llama.logit_scale"));
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.some_future_key"] = 1; }),
                  "metadata key llama.some_future_key is not supported"));
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.attention.value_length"] = 4u; }), "value_length"));
  EXPECT_TRUE(has(error([](ModelFile& m) { m.metadata["llama.vocab_size"] = 100u; }), "vocab_size = 100"));
  // Neutral values and information-only keys are accepted.
  EXPECT_EQ(error([](ModelFile& m) {
              m.metadata["llama.expert_count"] = 0u;
              m.metadata["llama.attention.causal"] = true;
              m.metadata["llama.rope.scaling.type"] = "none";
              m.metadata["llama.rope.scaling.original_context_length"] = 2048u;
              m.metadata["llama.rope.scaling.finetuned"] = false;
              m.metadata["llama.vocab_size"] = 512u;
            }),
            "<no error>");
}

TEST(GgufKeys, HyperparametersAreRangeCheckedBeforeUse) {
  auto error = [](const char* key, nlohmann::ordered_json v) {
    ModelFile m = load_model(kStoriesGguf);
    m.metadata[key] = v;
    return test::error_of([&] { read_hparams(m); });
  };
  EXPECT_NE(error("llama.context_length", 0).find("llama.context_length = 0 must be positive"), std::string::npos);
  EXPECT_NE(error("llama.context_length", -5).find("llama.context_length = -5 must be positive"), std::string::npos);
  EXPECT_NE(error("llama.embedding_length", uint64_t{1} << 63).find("llama.embedding_length = 9223372036854775808 is out of range"),
            std::string::npos);
  EXPECT_NE(error("llama.attention.key_length", int64_t{1} << 40).find("key_length = 1099511627776 exceeds the limit"),
            std::string::npos);
  EXPECT_NE(error("llama.block_count", 0).find("block_count = 0 must be positive"), std::string::npos);
  // A derived head_dim names the keys it came from, not a key_length the file does not have.
  for (int n_embd : {3, 1})
    EXPECT_NE(error("llama.embedding_length", n_embd)
                  .find(fmt::format("llama.embedding_length = {} is not a multiple of llama.attention.head_count = 8 "
                                    "(head_dim = n_embd / n_head, as the file has no llama.attention.key_length)",
                                    n_embd)),
              std::string::npos)
        << error("llama.embedding_length", n_embd);
  // With key_length given, n_embd need not divide (Gemma's head_dim differs from n_embd / n_head).
  EXPECT_EQ(test::error_of([] {
              ModelFile m = load_model(kStoriesGguf);
              m.metadata["llama.embedding_length"] = 3;
              m.metadata["llama.attention.key_length"] = 8;
              read_hparams(m);
            }),
            "<no error>");
}

TEST(HfConfig, DerivedHeadDimNamesTheKeysItCameFrom) {
  ModelFile m = load_model(std::string(MK_SHARED_DIR) + "/fixtures/hf/qwen2_bias_float32");  // no head_dim key
  m.metadata["hf.config"]["hidden_size"] = 3;
  const std::string e = test::error_of([&] { read_hparams(m); });
  EXPECT_NE(e.find("config.json: hidden_size = 3 is not a multiple of num_attention_heads = 6"), std::string::npos) << e;
  EXPECT_NE(e.find("as config.json has no head_dim"), std::string::npos) << e;
}

TEST(TokenizerGgufFlags, TokenTypesOutsideTheEnumAreRefused) {
  ModelFile m = load_model(kStoriesGguf);
  m.metadata["tokenizer.ggml.token_type"][7] = 9;
  EXPECT_NE(test::error_of([&] { load_model_tokenizer(m); }).find("tokenizer.ggml.token_type[7] = 9 is not a token type"),
            std::string::npos);
  m.metadata["tokenizer.ggml.token_type"][7] = -1;
  EXPECT_NE(test::error_of([&] { load_model_tokenizer(m); }).find("token_type[7] = -1"), std::string::npos);
}

std::string gguf_header(uint64_t n_tensors, uint64_t n_kv) {
  std::string s = "GGUF";
  uint32_t version = 3;
  s.append(reinterpret_cast<const char*>(&version), 4);
  s.append(reinterpret_cast<const char*>(&n_tensors), 8);
  s.append(reinterpret_cast<const char*>(&n_kv), 8);
  return s;
}
std::string gguf_str(const std::string& v) {
  uint64_t n = v.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + v;
}

TEST(GgufLimits, OverlongNamesAreRefusedWithoutEchoingThem) {
  const std::string big(1 << 20, 'K');
  uint32_t type_u8 = 0;
  std::string kv = gguf_header(0, 1) + gguf_str(big) + std::string(reinterpret_cast<const char*>(&type_u8), 4) + "x";
  std::string e = test::error_of([&] { load_gguf(MappedFile::from_bytes(kv, "k.gguf")); });
  EXPECT_NE(e.find("is longer than 65535 bytes"), std::string::npos) << e.substr(0, 200);
  EXPECT_LT(e.size(), 400u);
  uint32_t n_dims = 1, f32 = 0;
  uint64_t ne = 1, off = 0;
  std::string ti = gguf_header(1, 0) + gguf_str(std::string(100, 'n')) + std::string(reinterpret_cast<const char*>(&n_dims), 4) +
                   std::string(reinterpret_cast<const char*>(&ne), 8) + std::string(reinterpret_cast<const char*>(&f32), 4) +
                   std::string(reinterpret_cast<const char*>(&off), 8) + std::string(64, '\0');
  e = test::error_of([&] { load_gguf(MappedFile::from_bytes(ti, "t.gguf")); });
  EXPECT_NE(e.find("longer than ggml's limit of 63 bytes"), std::string::npos) << e;
}

// config.json values that conflict (aliases, or a value at two places) are errors, not "first wins".
TEST(HfConfigConflicts, AliasesAndRopeValuesMustAgree) {
  nlohmann::ordered_json c = {{"hidden_size", 64}, {"n_embd", 32}};
  EXPECT_NE(test::error_of([&] { hf_config_int(c, {"hidden_size", "n_embd"}); }).find("hidden_size = 64 and n_embd = 32 disagree"),
            std::string::npos);
  c = {{"hidden_size", 64}, {"n_embd", 64}};
  EXPECT_EQ(hf_config_int(c, {"hidden_size", "n_embd"}), 64);
  c = {{"rope_theta", 10000.0}, {"rope_parameters", {{"rope_theta", 500000.0}, {"rope_type", "default"}}}};
  EXPECT_NE(test::error_of([&] { read_hf_rope(c); }).find("disagree"), std::string::npos);
  c = {{"rope_scaling", {{"rope_type", "linear"}, {"type", "llama3"}, {"factor", 2.0}}}};
  EXPECT_NE(test::error_of([&] { read_hf_rope(c); }).find("disagree"), std::string::npos);
  c = {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}},
       {"rope_parameters", {{"rope_type", "linear"}, {"factor", 4.0}}}};
  EXPECT_NE(test::error_of([&] { read_hf_rope(c); }).find("both given and differ"), std::string::npos);
  c = {{"partial_rotary_factor", 1e300}};
  EXPECT_NE(test::error_of([&] { read_hf_rope(c); }).find("partial_rotary_factor"), std::string::npos);
}

}  // namespace
}  // namespace mk
