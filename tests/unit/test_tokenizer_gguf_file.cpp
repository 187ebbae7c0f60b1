// The tokenizer stored in the real stories260K.gguf encodes the reference prompts like run.c.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/model_file.h"
#include "model/tokenizer.h"

namespace mk {
namespace {

TEST(TokenizerGgufFile, Stories260KEncodesReferencePrompts) {
  const std::string dir = std::string(MK_SHARED_DIR) + "/models/stories260K/";
  const ModelFile model = load_gguf(dir + "stories260K.gguf");
  const auto tok = load_model_tokenizer(model);
  const auto bin = load_llama2c_tokenizer(dir + "tok512.bin", 512);
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->bos_id, 1);
  EXPECT_EQ(tok->eos_id, 2);
  std::ifstream in(dir + "reference_greedy.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const auto cases = nlohmann::json::parse(ss.str());
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    const std::string prompt = c.at("prompt");
    EXPECT_EQ(tok->encode(prompt, true), c.at("prompt_ids").get<std::vector<int32_t>>()) << prompt;
    // The generated text decodes the same from either vocab.
    auto ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    const auto gen = c.at("generated_ids").get<std::vector<int32_t>>();
    ids.insert(ids.end(), gen.begin(), gen.end());
    EXPECT_EQ(tok->decode(ids), bin->decode(ids));
  }
  for (const std::string s : {"Hello world", "héllo wörld 🙂", "Lily and Tom went to the park.\nThey played!"})
    EXPECT_EQ(tok->encode(s, true), bin->encode(s, true)) << s;
  for (int32_t id = 0; id < 512; ++id) EXPECT_EQ(tok->token_bytes(400, id), bin->token_bytes(400, id)) << id;
}

}  // namespace
}  // namespace mk
