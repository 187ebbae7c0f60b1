// Added-token flags and normalizers of tokenizer.json against the Hugging Face `tokenizers`
// package: tests/data/tokenizer_flags_expected.json holds its ids for every combination of
// single_word / lstrip / rstrip / normalized / special and for each normalizer, on inputs with
// whitespace and word characters inside and outside ASCII (regenerate with
// tests/data/gen_tokenizer_flags.py). Plus the ../shared/fixtures/bugs rows for tokenizers.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/tokenizer.h"
#include "model/unicode_text.h"
#include "support/errors.h"
#include "support/cli.h"

namespace mk {
namespace {

const std::string kBugs = std::string(MK_SHARED_DIR) + "/fixtures/bugs/";

using mk::test::read_json;

TEST(TokenizerFlags, MatchHuggingFaceTokenizers) {
  const nlohmann::json expected = read_json(std::string(MK_SOURCE_DIR) + "/tests/data/tokenizer_flags_expected.json");
  const nlohmann::json base = read_json(std::string(MK_SHARED_DIR) + "/" + expected["base"].get<std::string>());
  ASSERT_GT(expected["cases"].size(), 60u);
  size_t n_checked = 0;
  for (const auto& c : expected["cases"]) {
    nlohmann::json j = base;
    j["normalizer"] = c["normalizer"];
    j["added_tokens"] = nlohmann::json::array({base["added_tokens"][0]});
    for (const auto& t : c["added_tokens"]) j["added_tokens"].push_back(t);
    auto tok = parse_hf_tokenizer_json(j.dump(), "case");
    for (size_t i = 0; i < c["inputs"].size(); ++i) {
      const std::string input = c["inputs"][i];
      EXPECT_EQ(tok->encode(input, false), c["expected"][i].get<std::vector<int32_t>>())
          << "input " << nlohmann::json(input).dump() << " normalizer " << c["normalizer"].dump() << " added "
          << c["added_tokens"].dump();
      ++n_checked;
    }
  }
  EXPECT_GT(n_checked, 2000u);
}

// tokenizer_single_word.json: "gym" with single_word.
TEST(TokenizerFlags, SingleWordFixture) {
  auto t = load_hf_tokenizer_json(kBugs + "tokenizer_single_word.json");
  EXPECT_EQ(t->encode_prompt("gymnastics"), (std::vector<int32_t>{71, 89, 77, 78, 65, 336, 310, 83}));
  EXPECT_EQ(t->encode_prompt("abcdgym"), (std::vector<int32_t>{394, 67, 68, 71, 89, 77}));
  EXPECT_EQ(t->encode_prompt("a gym"), (std::vector<int32_t>{65, 221, 512}));
}

// tokenizer_nfc.json: normalizer NFC.
TEST(TokenizerNormalizers, NfcFixture) {
  auto t = load_hf_tokenizer_json(kBugs + "tokenizer_nfc.json");
  EXPECT_EQ(t->encode_prompt("e\u0301"), (std::vector<int32_t>{128, 103}));
  EXPECT_EQ(t->encode_prompt("Cafe\u0301 au lait"), (std::vector<int32_t>{35, 65, 70, 128, 103, 268, 85, 340, 65, 320}));
}

TEST(TokenizerNormalizers, UnicodeForms) {
  EXPECT_EQ(unicode_normalize("e\u0301", UnicodeForm::NFC), "\u00e9");
  EXPECT_EQ(unicode_normalize("\u00e9", UnicodeForm::NFD), "e\u0301");
  EXPECT_EQ(unicode_normalize("\ufb01\u00bd", UnicodeForm::NFKC), "fi1\u20442");
  EXPECT_EQ(unicode_normalize("\u1e9b\u0323", UnicodeForm::NFKD), "s\u0323\u0307");
  EXPECT_EQ(unicode_normalize(std::string("a\0b", 3), UnicodeForm::NFC), std::string("a\0b", 3));
  EXPECT_EQ(unicode_lowercase("\u0130I\u03a3"), "i\u0307i\u03c3");
  EXPECT_EQ(unicode_strip("\u3000 x\u00a0y \u2028", true, true), "x\u00a0y");
  EXPECT_EQ(unicode_strip("  x  ", false, true), "  x");
  EXPECT_EQ(unicode_strip_accents("e\u0301a\u0308"), "ea");
}

TEST(TokenizerNormalizers, UnsupportedOnesAreRefusedByName) {
  nlohmann::json j = read_json(kBugs + "tokenizer_nfc.json");
  for (const char* type : {"BertNormalizer", "Precompiled", "Nmt", "ByteLevel", "SomethingNew"}) {
    j["normalizer"] = {{"type", type}};
    EXPECT_NE(test::error_of([&] { parse_hf_tokenizer_json(j.dump(), "t.json"); }).find(type), std::string::npos)
        << type;
  }
}

// Load-time validation of what the encoding loops depend on, and of conflicting entries.
TEST(TokenizerValidation, RefusesWhatLoopsOrLookupsCannotUse) {
  nlohmann::json j = read_json(kBugs + "tokenizer_nfc.json");
  nlohmann::json m = j;
  m["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", ""}};
  EXPECT_NE(test::error_of([&] { parse_hf_tokenizer_json(m.dump(), "t.json"); }).find("replacement must not be empty"),
            std::string::npos);
  m = j;
  m["decoder"] = {{"type", "Metaspace"}, {"replacement", ""}};
  EXPECT_NE(test::error_of([&] { parse_hf_tokenizer_json(m.dump(), "t.json"); }).find("replacement must not be empty"),
            std::string::npos);
  m = j;
  m["model"]["vocab"]["zzz-duplicate"] = 5;  // id 5 is already taken
  EXPECT_NE(test::error_of([&] { parse_hf_tokenizer_json(m.dump(), "t.json"); }).find("gives id 5 to both"),
            std::string::npos);
  // A key twice in one object, in the text (nlohmann would keep the last).
  std::string text = j.dump();
  text.insert(1, R"("normalizer": {"type": "NFD"}, )");
  EXPECT_NE(test::error_of([&] { parse_hf_tokenizer_json(text, "t.json"); }).find("\"normalizer\" appears twice"),
            std::string::npos);
  // Nesting: refused while parsing, long before any recursive copy.
  std::string deep = R"({"model": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_NE(test::error_of([&] { parse_hf_tokenizer_json(deep, "t.json"); }).find("nested deeper than 64"),
            std::string::npos);
}

// TemplateProcessing: the token before $A is BOS, the one after it is appended (it must be EOS);
// other post-processors are refused by name rather than ignored.
TEST(TokenizerValidation, PostProcessorTemplateEnds) {
  nlohmann::json j = read_json(kBugs + "tokenizer_nfc.json");
  auto with = [&](const char* single) {
    nlohmann::json k = j;
    k["post_processor"] = nlohmann::json::parse(std::string(R"({"type": "TemplateProcessing", "single": )") + single +
                                                R"(, "pair": [], "special_tokens": {"<|endoftext|>": {"ids": [0]}}})");
    return k.dump();
  };
  auto t = parse_hf_tokenizer_json(with(R"([{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<|endoftext|>"}}])"), "t");
  EXPECT_TRUE(t->add_eos);
  EXPECT_EQ(t->eos_id, 0);
  EXPECT_EQ(t->encode_prompt("e\u0301"), (std::vector<int32_t>{128, 103, 0}));
  t = parse_hf_tokenizer_json(with(R"([{"SpecialToken": {"id": "<|endoftext|>"}}, {"Sequence": {"id": "A"}}])"), "t");
  EXPECT_EQ(t->encode_prompt("e\u0301"), (std::vector<int32_t>{0, 128, 103}));
  EXPECT_NE(test::error_of([&] {
              parse_hf_tokenizer_json(with(R"([{"SpecialToken": {"id": "<|endoftext|>"}}, {"SpecialToken": {"id": "<|endoftext|>"}}, {"Sequence": {"id": "A"}}])"), "t");
            }).find("more than one token"),
            std::string::npos);
  nlohmann::json k = j;
  k["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(test::error_of([&] { parse_hf_tokenizer_json(k.dump(), "t"); }).find("decoder WordPiece is not supported"),
            std::string::npos);
  k = j;
  k["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 0}, {"stop", 1}};
  EXPECT_NE(test::error_of([&] { parse_hf_tokenizer_json(k.dump(), "t"); }).find("decoder Strip"), std::string::npos);
  k = j;
  k["model"]["dropout"] = 0.1;
  EXPECT_NE(test::error_of([&] { parse_hf_tokenizer_json(k.dump(), "t"); }).find("model.dropout 0.1"), std::string::npos);
  for (const char* type : {"BertProcessing", "RobertaProcessing"}) {
    nlohmann::json k = j;
    k["post_processor"] = {{"type", type}};
    EXPECT_NE(test::error_of([&] { parse_hf_tokenizer_json(k.dump(), "t"); }).find(std::string("post_processor ") + type),
              std::string::npos);
  }
}

}  // namespace
}  // namespace mk
