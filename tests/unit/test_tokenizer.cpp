// Tokenizer tests: SentencePiece-style BPE on the real llama2.c vocabs (tok512.bin, Llama 2's
// tokenizer.bin), the same vocab given as GGUF metadata, decoding and streaming UTF-8, and damaged
// tokenizer files.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "model/model_file.h"
#include "model/tokenizer.h"
#include "support/error.h"
#include "support/mmap.h"

namespace mk {
namespace {

const std::string kShared = MK_SHARED_DIR;
const std::string kTok512 = kShared + "/models/stories260K/tok512.bin";
const std::string kLlama2Tok = kShared + "/models/llama2-tokenizer/tokenizer.bin";
const std::string kReference = kShared + "/models/stories260K/reference_greedy.json";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The test's own reading of a tokenizer.bin (independent of the loader under test).
SpmVocab parse_tokenizer_bin(const std::string& bytes, int32_t n_vocab) {
  SpmVocab v;
  size_t off = 4;
  for (int32_t i = 0; i < n_vocab; ++i) {
    float score;
    int32_t len;
    std::memcpy(&score, bytes.data() + off, 4);
    std::memcpy(&len, bytes.data() + off + 4, 4);
    off += 8;
    v.scores.push_back(score);
    v.pieces.push_back(bytes.substr(off, len));
    off += len;
  }
  return v;
}

// llama2.c run.c's encoder, transcribed literally as the oracle: quadratic, one merge per full scan.
// Pieces with ids < 3 (control) and byte pieces are not looked up as text.
class NaiveRunCEncoder {
 public:
  explicit NaiveRunCEncoder(const SpmVocab& v) : scores_(v.scores) {
    for (int32_t i = static_cast<int32_t>(v.pieces.size()) - 1; i >= 3; --i) {
      const std::string& p = v.pieces[i];
      if (p.size() == 6 && p.rfind("<0x", 0) == 0)
        byte_ids_[std::stoi(p.substr(3, 2), nullptr, 16)] = i;
      else
        ids_[p] = i;
    }
  }

  std::vector<int32_t> encode(const std::string& text) const {
    std::vector<int32_t> out = {1};
    if (text.empty()) return out;
    std::vector<std::string> sym;
    std::vector<int32_t> tok;
    const std::string s = " " + text;
    for (size_t i = 0; i < s.size();) {
      size_t n = 1;
      while (i + n < s.size() && (static_cast<uint8_t>(s[i + n]) & 0xC0) == 0x80 && n < 4) ++n;
      std::string cp = s.substr(i, n);
      if (auto it = ids_.find(cp); it != ids_.end()) {
        tok.push_back(it->second);
        sym.push_back(cp);
      } else {
        for (char c : cp) {
          tok.push_back(byte_ids_.at(static_cast<uint8_t>(c)));
          sym.push_back(std::string("\x01") + c);  // never part of a merge
        }
      }
      i += n;
    }
    for (;;) {
      float best = -1e30f;
      int best_i = -1, best_id = -1;
      for (size_t i = 0; i + 1 < tok.size(); ++i) {
        auto it = ids_.find(sym[i] + sym[i + 1]);
        if (it != ids_.end() && scores_[it->second] > best) {
          best = scores_[it->second];
          best_i = static_cast<int>(i);
          best_id = it->second;
        }
      }
      if (best_i < 0) break;
      tok[best_i] = best_id;
      sym[best_i] += sym[best_i + 1];
      tok.erase(tok.begin() + best_i + 1);
      sym.erase(sym.begin() + best_i + 1);
    }
    out.insert(out.end(), tok.begin(), tok.end());
    return out;
  }

 private:
  std::vector<float> scores_;
  std::map<std::string, int32_t> ids_;
  std::map<int, int32_t> byte_ids_;
};

// Random valid UTF-8 text from fragments that exercise merges, spaces, newlines and byte fallback.
std::string random_text(std::mt19937& rng, int n_fragments) {
  static const char* fragments[] = {"Once", " upon", " a", " time", "Lily", " and", " the", " park", ".", ",",
                                    "\n", " ", "  ", "!", "?", "é", "ö", "ü", "日本", "🙂", "—", "x", "zz",
                                    "Tom", " went", " to", " play", "ing", "ed", "'s", "\"", "\t", "123", "Ω"};
  std::uniform_int_distribution<size_t> pick(0, std::size(fragments) - 1);
  std::string s;
  for (int i = 0; i < n_fragments; ++i) s += fragments[pick(rng)];
  return s;
}

class TokenizerTok512 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tok_ = load_llama2c_tokenizer(kTok512, 512).release(); }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static Tokenizer* tok_;
};
Tokenizer* TokenizerTok512::tok_ = nullptr;

TEST_F(TokenizerTok512, ReferencePromptsEncodeToPromptIds) {
  const auto cases = nlohmann::json::parse(read_file(kReference));
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    const std::string prompt = c.at("prompt");
    const auto expected = c.at("prompt_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok_->encode(prompt, true), expected) << "prompt: " << prompt;
  }
}

TEST_F(TokenizerTok512, SpecialIds) {
  EXPECT_EQ(tok_->n_vocab(), 512);
  EXPECT_EQ(tok_->bos_id, 1);
  EXPECT_EQ(tok_->eos_id, 2);
  EXPECT_EQ(tok_->unk_id, 0);
  EXPECT_TRUE(tok_->is_eos(2));
  EXPECT_FALSE(tok_->is_eos(1));
  EXPECT_FALSE(tok_->is_eos(-1));
  EXPECT_EQ(tok_->encode("", true), std::vector<int32_t>{1});
  EXPECT_TRUE(tok_->encode("", false).empty());
}

// Expected ids produced by the SentencePiece library from tok512.model (the same vocab).
TEST_F(TokenizerTok512, MatchesSentencePiece) {
  EXPECT_EQ(tok_->encode("Hello world", true), (std::vector<int32_t>{1, 346, 306, 414, 263, 304, 341}));
  EXPECT_EQ(tok_->encode("héllo wörld 🙂", true),
            (std::vector<int32_t>{1, 270, 485, 306, 414, 263, 198, 185, 420, 341, 410, 243, 162, 156, 133}));
  EXPECT_EQ(tok_->encode("Lily and Tom went to the park.\nThey played!", true),
            (std::vector<int32_t>{1, 317, 269, 274, 287, 263, 377, 267, 265, 282, 295, 433, 426, 13, 434, 260, 422,
                                  337, 266, 443}));
  EXPECT_EQ(tok_->encode("a\tb", true), (std::vector<int32_t>{1, 261, 12, 430}));
  EXPECT_EQ(tok_->encode("日本語", true), (std::vector<int32_t>{1, 410, 233, 154, 168, 233, 159, 175, 235, 173, 161}));
  // Literal "<0x41>" is text, never a byte piece; "<s>" is text without parse_special (SentencePiece's
  // encode), BOS with it (llama.cpp's and the .gguf form's: trial 42).
  EXPECT_EQ(tok_->encode("<0x41>", true), (std::vector<int32_t>{1, 410, 504, 477, 444, 484, 475, 505}));
  EXPECT_EQ(tok_->encode("<s>", true, false), (std::vector<int32_t>{1, 410, 504, 419, 505}));
  EXPECT_EQ(tok_->encode("<s>", true), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(tok_->token_text(1), "<s>");  // tokenizer.bin writes "\n<s>\n": a chat template's bos_token
  EXPECT_EQ(tok_->token_text(2), "</s>");
}

TEST_F(TokenizerTok512, ByteFallbackUsesBytePieces) {
  // U+1F642 is not a piece: four byte-fallback tokens <0xF0><0x9F><0x99><0x82> = ids 3 + byte.
  const auto ids = tok_->encode("🙂", false);
  ASSERT_GE(ids.size(), 4u);
  const std::vector<int32_t> tail(ids.end() - 4, ids.end());
  EXPECT_EQ(tail, (std::vector<int32_t>{3 + 0xF0, 3 + 0x9F, 3 + 0x99, 3 + 0x82}));
}

TEST_F(TokenizerTok512, DecodeRoundTrips) {
  for (const std::string s : {"Once upon a time", "Hello world", "héllo wörld 🙂", "  two  spaces ", "a\tb\n\nc",
                              "日本語のテキスト", "x", " leading space", "trailing space ", "\xF0\x9F\x99\x82\xC3\xA9"}) {
    EXPECT_EQ(tok_->decode(tok_->encode(s, true)), s);
    EXPECT_EQ(tok_->decode(tok_->encode(s, false)), s);
  }
}

TEST_F(TokenizerTok512, InvalidUtf8InputDecodesToReplacement) {
  // Raw bytes encode as byte pieces; decoding gives valid UTF-8 with U+FFFD for each bad subpart.
  const std::string bad = "a\xFF" "b\xC3";
  const auto ids = tok_->encode(bad, true);
  EXPECT_EQ(tok_->decode(ids), "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  std::string raw;
  int32_t prev = -1;
  for (int32_t id : ids) {
    raw += tok_->token_bytes(prev, id);
    prev = id;
  }
  EXPECT_EQ(raw, bad);
}

TEST_F(TokenizerTok512, TokenBytes) {
  EXPECT_EQ(tok_->token_bytes(-1, 1), "");  // BOS
  EXPECT_EQ(tok_->token_bytes(5, 2), "");   // EOS
  EXPECT_EQ(tok_->token_bytes(5, 0), "");   // unknown
  EXPECT_EQ(tok_->token_bytes(1, 3 + 'A'), "A");
  EXPECT_EQ(tok_->token_bytes(1, 3 + 0xE2), "\xE2");
  EXPECT_EQ(tok_->token_bytes(1, 261), "a");     // " a" after BOS: dummy prefix dropped
  EXPECT_EQ(tok_->token_bytes(400, 261), " a");  // mid-text: the space is real
  EXPECT_THROW(tok_->token_bytes(1, 512), Error);
  EXPECT_THROW(tok_->token_bytes(1, -1), Error);
  EXPECT_THROW(tok_->decode({1, 99999}), Error);
}

TEST_F(TokenizerTok512, MatchesNaiveRunCEncoder) {
  const NaiveRunCEncoder naive(parse_tokenizer_bin(read_file(kTok512), 512));
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const std::string s = random_text(rng, 1 + trial % 40);
    ASSERT_EQ(tok_->encode(s, true), naive.encode(s)) << "text: " << s;
  }
}

class TokenizerLlama2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tok_ = load_llama2c_tokenizer(kLlama2Tok, 32000).release(); }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static Tokenizer* tok_;
};
Tokenizer* TokenizerLlama2::tok_ = nullptr;

TEST_F(TokenizerLlama2, KnownEncodings) {
  EXPECT_EQ(tok_->encode("Hello world", true), (std::vector<int32_t>{1, 15043, 3186}));
  EXPECT_EQ(tok_->encode("Hello world", false), (std::vector<int32_t>{15043, 3186}));
  // " Hello" and " world" are whole pieces; decoding after BOS drops the dummy prefix.
  EXPECT_EQ(tok_->token_bytes(1, 15043), "Hello");
  EXPECT_EQ(tok_->token_bytes(15043, 3186), " world");
  EXPECT_EQ(tok_->decode({1, 15043, 3186, 2}), "Hello world");
}

TEST_F(TokenizerLlama2, RoundTripsAndMatchesNaiveEncoder) {
  const NaiveRunCEncoder naive(parse_tokenizer_bin(read_file(kLlama2Tok), 32000));
  for (const std::string s : {"Hello world", "héllo wörld 🙂", "The quick brown fox jumps over the lazy dog.",
                              "  indented\n\tcode();", "日本語のテキスト", "Здравствуй, мир!", "emoji 🦙🦙"}) {
    const auto ids = tok_->encode(s, true);
    EXPECT_EQ(ids, naive.encode(s)) << s;
    EXPECT_EQ(tok_->decode(ids), s);
  }
  std::mt19937 rng(99);
  for (int trial = 0; trial < 40; ++trial) {
    const std::string s = random_text(rng, 1 + trial);
    ASSERT_EQ(tok_->encode(s, true), naive.encode(s)) << "text: " << s;
  }
}

TEST_F(TokenizerLlama2, LongPromptIsFast) {
  std::mt19937 rng(7);
  const std::string text = random_text(rng, 6000);  // about 25 KB
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok_->encode(text, true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(ids.size(), 3000u);
  EXPECT_LT(seconds, 1.0) << ids.size() << " tokens";
  EXPECT_EQ(tok_->decode(ids), text);
}

// --- the same vocab given as GGUF metadata --------------------------------------------------------

std::string markers_from_spaces(const std::string& s) {
  std::string out;
  for (char c : s) out += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
  return out;
}

// A ModelFile whose metadata mirrors what the GGUF loader stores for tok512 in stories260K.gguf.
ModelFile tok512_as_gguf() {
  const SpmVocab v = parse_tokenizer_bin(read_file(kTok512), 512);
  ModelFile m;
  m.path = "tok512.gguf";
  m.format = "gguf";
  auto tokens = nlohmann::ordered_json::array();
  auto scores = nlohmann::ordered_json::array();
  auto types = nlohmann::ordered_json::array();
  for (size_t i = 0; i < v.pieces.size(); ++i) {
    std::string piece = v.pieces[i];
    if (i == 1) piece = "<s>";
    if (i == 2) piece = "</s>";
    tokens.push_back(markers_from_spaces(piece));
    scores.push_back(v.scores[i]);
    types.push_back(i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
  }
  m.metadata["tokenizer.ggml.model"] = "llama";
  m.metadata["tokenizer.ggml.tokens"] = tokens;
  m.metadata["tokenizer.ggml.scores"] = scores;
  m.metadata["tokenizer.ggml.token_type"] = types;
  m.metadata["tokenizer.ggml.bos_token_id"] = 1;
  m.metadata["tokenizer.ggml.eos_token_id"] = 2;
  m.metadata["tokenizer.ggml.unknown_token_id"] = 0;
  return m;
}

TEST(TokenizerGguf, EncodesLikeTheBinVocab) {
  const auto bin = load_llama2c_tokenizer(kTok512, 512);
  const auto gguf = load_model_tokenizer(tok512_as_gguf());
  EXPECT_EQ(gguf->n_vocab(), 512);
  EXPECT_EQ(gguf->bos_id, 1);
  EXPECT_EQ(gguf->eos_id, 2);
  const auto cases = nlohmann::json::parse(read_file(kReference));
  for (const auto& c : cases)
    EXPECT_EQ(gguf->encode(c.at("prompt").get<std::string>(), true), c.at("prompt_ids").get<std::vector<int32_t>>());
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const std::string s = random_text(rng, 1 + trial % 30);
    const auto ids = gguf->encode(s, true);
    ASSERT_EQ(ids, bin->encode(s, true)) << s;
    ASSERT_EQ(gguf->decode(ids), s);
  }
  for (int32_t id = 0; id < 512; ++id) {
    EXPECT_EQ(gguf->token_bytes(1, id), bin->token_bytes(1, id)) << id;
    EXPECT_EQ(gguf->token_bytes(400, id), bin->token_bytes(400, id)) << id;
  }
}

TEST(TokenizerGguf, MarkerInTextIsASpace) {
  // As in SentencePiece, U+2581 in the input is the normalised form of a space.
  const auto tok = load_model_tokenizer(tok512_as_gguf());
  EXPECT_EQ(tok->encode("a\xE2\x96\x81" "b", true), tok->encode("a b", true));
}

TEST(TokenizerGguf, AddSpacePrefixFalse) {
  ModelFile m = tok512_as_gguf();
  m.metadata["tokenizer.ggml.add_space_prefix"] = false;
  const auto tok = load_model_tokenizer(m);
  const auto with_prefix = load_model_tokenizer(tok512_as_gguf());
  EXPECT_EQ(tok->encode(" Once upon a time", true), with_prefix->encode("Once upon a time", true));
  EXPECT_EQ(tok->decode(tok->encode("Once upon", true)), "Once upon");
}

// Control and unknown pieces written in the text are their ids with parse_special, user-defined ones
// always (llama.cpp's tokenizer_st_partition); each run of text between them gets the dummy prefix.
// Until 2026-12-06 the SentencePiece tokenizer matched none: a Llama 2 template's "<s>" reached the
// model as "<", "s", ">" and Gemma's "<start_of_turn>" as a dozen pieces.
TEST(TokenizerGguf, SpecialPiecesInTextAreTheirIds) {
  ModelFile m = tok512_as_gguf();
  auto& tokens = m.metadata["tokenizer.ggml.tokens"];
  auto& types = m.metadata["tokenizer.ggml.token_type"];
  tokens[500] = "<start_of_turn>";  // control, as in Gemma's vocabulary
  types[500] = 3;
  tokens[501] = "<start>";  // control, a prefix of the one above: the longer piece matches first
  types[501] = 3;
  tokens[502] = "<mine>";  // user-defined
  types[502] = 4;
  const auto tok = load_model_tokenizer(m);
  const auto plain = load_model_tokenizer(tok512_as_gguf());
  auto cat = [](std::vector<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  // "<s>" and "</s>" are control pieces: their ids, and the text after each has its own dummy prefix.
  EXPECT_EQ(tok->encode("<s>hi</s>", false, true), cat({{1}, plain->encode("hi", false), {2}}));
  EXPECT_EQ(tok->encode("<s>[INST] Once [/INST]", false, true),
            cat({{1}, plain->encode("[INST] Once [/INST]", false)}));
  // Without parse_special they are text (tokenize without --parse-special), and so is an unknown piece.
  EXPECT_EQ(tok->encode("<s>hi</s>", false, false), plain->encode("<s>hi</s>", false, false));
  EXPECT_EQ(tok->encode("a<unk>b", false, true), cat({plain->encode("a", false), {0}, plain->encode("b", false)}));
  EXPECT_EQ(tok->encode("a<unk>b", false, false), plain->encode("a<unk>b", false, false));
  // The longest piece first: "<start_of_turn>" is not "<start>" + "_of_turn>".
  EXPECT_EQ(tok->encode("<start_of_turn>user\nhi<start>", true, true),
            cat({{1, 500}, plain->encode("user\nhi", false), {501}}));
  // A user-defined piece matches without parse_special too; adjacent pieces give no empty runs.
  EXPECT_EQ(tok->encode("x<mine><mine>y", false, false),
            cat({plain->encode("x", false), {502, 502}, plain->encode("y", false)}));
  // Text without special pieces encodes as before.
  EXPECT_EQ(tok->encode("Once upon a time", true, true), plain->encode("Once upon a time", true, true));
  // A llama2.c tokenizer.bin has no token types; it gets the GGUF form's (unknown 0, control 1 and
  // 2 named <s> and </s>, bytes), so its "<s>" and "</s>" parse as the GGUF's do (run.c parses none).
  const auto bin = load_llama2c_tokenizer(kTok512, 512);
  EXPECT_EQ(bin->encode("<s>hi</s>", false, true), cat({{1}, plain->encode("hi", false, false), {2}}));
  EXPECT_EQ(bin->encode("<s>hi", false, false), plain->encode("<s>hi", false, false));
}

// llama.cpp's load-time rules (llama-vocab.cpp), compared with llama-cpp-python 0.3.16 on copies of
// stories260K.gguf on 2026-12-06: a piece named like an end of generation is a control piece
// whatever its type (real Gemma GGUFs mark <end_of_turn> user-defined), so it matches in text only
// with parse_special; and in a vocabulary named Phi-3 every special piece but <unk>, <s> and
// <|endoftext|> takes the whitespace after it ("<|user|>\nhi" is <|user|>, "hi").
TEST(TokenizerGguf, LlamaCppVocabularyRules) {
  auto cat = [](std::vector<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  const auto plain = load_model_tokenizer(tok512_as_gguf());
  ModelFile m = tok512_as_gguf();
  auto& tokens = m.metadata["tokenizer.ggml.tokens"];
  auto& types = m.metadata["tokenizer.ggml.token_type"];
  tokens[500] = "<start_of_turn>";
  types[500] = 4;  // user-defined: always matches
  tokens[501] = "<end_of_turn>";
  types[501] = 4;  // user-defined but named as an end of generation: control
  tokens[502] = "<|user|>";
  types[502] = 4;
  tokens[503] = "<|endoftext|>";
  types[503] = 3;
  {
    const auto tok = load_model_tokenizer(m);
    EXPECT_EQ(tok->encode("x<start_of_turn>y", false, false),
              cat({plain->encode("x", false), {500}, plain->encode("y", false)}));
    EXPECT_EQ(tok->encode("x<end_of_turn>y", false, true),
              cat({plain->encode("x", false), {501}, plain->encode("y", false)}));
    EXPECT_EQ(tok->encode("x<end_of_turn>y", false, false), plain->encode("x<end_of_turn>y", false, false));
    EXPECT_EQ(tok->token_bytes(-1, 501), "");  // a control piece decodes to nothing
    EXPECT_TRUE(tok->is_eos(501));
    // Not a Phi-3 vocabulary: the newline after a special piece stays.
    EXPECT_EQ(tok->encode("<|user|>\nhi", false, true), cat({{502}, plain->encode("\nhi", false)}));
  }
  m.metadata["general.name"] = "Phi-3-mini-4k-instruct";
  const auto phi3 = load_model_tokenizer(m);
  EXPECT_EQ(phi3->encode("<|user|>\nhi<end_of_turn>\n\t x", false, true),
            cat({{502}, plain->encode("hi", false), {501}, plain->encode("x", false)}));
  EXPECT_EQ(phi3->encode("<|user|> \n", false, true), (std::vector<int32_t>{502}));
  // <s> and <|endoftext|> keep the whitespace after them.
  EXPECT_EQ(phi3->encode("<|endoftext|>\nhi", false, true), cat({{503}, plain->encode("\nhi", false)}));
  EXPECT_EQ(phi3->encode("<s> hi", false, true), cat({{1}, plain->encode(" hi", false)}));
  EXPECT_EQ(phi3->encode("</s> hi", false, true), cat({{2}, plain->encode("hi", false)}));
  // Without parse_special a control piece is text, and text keeps its whitespace.
  EXPECT_EQ(phi3->encode("</s> hi", false, false), plain->encode("</s> hi", false, false));
}

TEST(TokenizerGguf, EndOfTurnNamesEndGeneration) {
  ModelFile m = tok512_as_gguf();
  m.metadata["tokenizer.ggml.tokens"][300] = "<end_of_turn>";  // as in Gemma's vocabulary
  const auto tok = load_model_tokenizer(m);
  EXPECT_TRUE(tok->is_eos(300));
  EXPECT_TRUE(tok->is_eos(2));
  EXPECT_FALSE(tok->is_eos(299));
}

TEST(TokenizerGguf, EotIsAnExtraEos) {
  ModelFile m = tok512_as_gguf();
  m.metadata["tokenizer.ggml.eot_token_id"] = 0;
  const auto tok = load_model_tokenizer(m);
  EXPECT_TRUE(tok->is_eos(2));
  EXPECT_TRUE(tok->is_eos(0));
  EXPECT_FALSE(tok->is_eos(1));
}

void expect_error(const ModelFile& m, const std::string& needle) {
  try {
    load_model_tokenizer(m);
    ADD_FAILURE() << "expected an error containing " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerGguf, BadMetadataIsAnError) {
  {
    ModelFile m = tok512_as_gguf();
    m.metadata["tokenizer.ggml.model"] = "bert";  // WordPiece: not supported
    expect_error(m, "tokenizer model \"bert\" is not supported");
  }
  {
    ModelFile m = tok512_as_gguf();
    m.metadata["tokenizer.ggml.model"] = "gpt2";  // a SentencePiece vocab has no merges
    expect_error(m, "missing metadata key tokenizer.ggml.merges");
  }
  {
    ModelFile m = tok512_as_gguf();
    m.metadata.erase("tokenizer.ggml.model");
    expect_error(m, "tokenizer.ggml.model");
  }
  {
    ModelFile m = tok512_as_gguf();
    m.metadata.erase("tokenizer.ggml.tokens");
    expect_error(m, "tokenizer.ggml.tokens");
  }
  {
    ModelFile m = tok512_as_gguf();
    m.metadata["tokenizer.ggml.scores"].erase(0);
    expect_error(m, "tokenizer.ggml.scores");
  }
  {
    ModelFile m = tok512_as_gguf();
    m.metadata["tokenizer.ggml.token_type"] = 7;
    expect_error(m, "tokenizer.ggml.token_type");
  }
  {
    ModelFile m = tok512_as_gguf();
    m.metadata["tokenizer.ggml.tokens"][5] = 3;
    expect_error(m, "tokenizer.ggml.tokens[5]");
  }
  {
    ModelFile m = tok512_as_gguf();
    m.metadata["tokenizer.ggml.bos_token_id"] = 512;
    expect_error(m, "tokenizer.ggml.bos_token_id");
  }
  {
    ModelFile m = tok512_as_gguf();
    m.metadata["tokenizer.ggml.token_type"][300] = 6;  // byte type on a text piece
    expect_error(m, "piece 300");
  }
  {
    ModelFile m = tok512_as_gguf();
    m.metadata["tokenizer.ggml.add_space_prefix"] = "yes";
    expect_error(m, "add_space_prefix");
  }
}

TEST(TokenizerModel, OtherFormats) {
  ModelFile m;
  m.path = "stories260K.bin";
  m.format = "llama2c";
  expect_error(m, "pass one with -z");
  m.format = "hf";
  expect_error(m, "tokenizer.json");
  m.format = "onnx";
  expect_error(m, "onnx");
}

// --- damaged tokenizer.bin ------------------------------------------------------------------------

void expect_load_error(const std::string& bytes, int32_t n_vocab, const std::string& needle = "") {
  try {
    load_llama2c_tokenizer(MappedFile::from_bytes(bytes, "damaged.bin"), n_vocab);
    ADD_FAILURE() << "expected an error (" << bytes.size() << " bytes)";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("damaged.bin"), std::string::npos) << msg;
    if (!needle.empty()) {
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  }
}

TEST(TokenizerDamaged, LoadsFromBytes) {
  const auto tok = load_llama2c_tokenizer(MappedFile::from_bytes(read_file(kTok512), "tok512"), 512);
  EXPECT_EQ(tok->encode("Once upon a time", true), (std::vector<int32_t>{1, 403, 407, 261, 378}));
}

TEST(TokenizerDamaged, CutShortAtEveryOffset) {
  const std::string bytes = read_file(kTok512);
  for (size_t n = 0; n < bytes.size(); ++n) expect_load_error(bytes.substr(0, n), 512);
  expect_load_error(bytes.substr(0, 100), 512, "offset");
}

TEST(TokenizerDamaged, WrongVocabSize) {
  const std::string bytes = read_file(kTok512);
  expect_load_error(bytes, 513, "after 512 of 513 tokens");
  expect_load_error(bytes, 300, "more tokens than the model's n_vocab");
  expect_load_error(bytes, 0, "n_vocab");
  expect_load_error(bytes, -5, "n_vocab");
}

void put_i32(std::string& s, size_t off, int32_t v) { std::memcpy(s.data() + off, &v, 4); }

TEST(TokenizerDamaged, BadLengthsAndScores) {
  const std::string bytes = read_file(kTok512);
  // Token 0 ("<unk>") starts at offset 4: score at 4, length at 8.
  for (int32_t len : {-1, -2147483647 - 1, 6227, 2147483647, 100000}) {
    std::string b = bytes;
    put_i32(b, 8, len);
    expect_load_error(b, 512, "token 0");
  }
  {
    std::string b = bytes;
    put_i32(b, 0, -3);
    expect_load_error(b, 512, "max_token_length");
  }
  {
    std::string b = bytes;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(b.data() + 4, &nan, 4);
    expect_load_error(b, 512, "NaN");
  }
  // Random corruption never crashes: it either loads or throws mk::Error.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    std::string b = bytes;
    for (int k = 0; k < 4; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    try {
      const auto tok = load_llama2c_tokenizer(MappedFile::from_bytes(b, "fuzz.bin"), 512);
      (void)tok->decode(tok->encode("Once upon a time, héllo 🙂", true));
    } catch (const Error&) {
    }
  }
}

TEST(TokenizerSpmVocab, InconsistentVocabIsAnError) {
  SpmVocab v;
  EXPECT_THROW(make_spm_tokenizer(v), Error);  // empty
  v.pieces = {"<unk>", "<s>", "</s>", "a"};
  v.scores = {0, 0, 0};
  EXPECT_THROW(make_spm_tokenizer(v), Error);  // 4 pieces, 3 scores
  v.scores = {0, 0, 0, 0};
  v.types = {2, 3};
  EXPECT_THROW(make_spm_tokenizer(v), Error);  // 2 types
  v.types.clear();
  v.eos_id = 4;
  EXPECT_THROW(make_spm_tokenizer(v), Error);  // eos out of range
}

TEST(TokenizerSpmVocab, NoByteFallbackGivesUnknown) {
  SpmVocab v;
  v.pieces = {"<unk>", "<s>", "</s>", " ", "a", "b", " a", "ab"};
  v.scores = {0, 0, 0, -1, -2, -3, -4, -0.5f};
  const auto tok = make_spm_tokenizer(v);
  // " ab": " a" (-4) vs "ab" (-0.5): "ab" wins, then " " + "ab" is no piece.
  EXPECT_EQ(tok->encode("ab", true), (std::vector<int32_t>{1, 3, 7}));
  EXPECT_EQ(tok->encode("a\xC3\xA9", false), (std::vector<int32_t>{6, 0}));  // é: unknown
  EXPECT_EQ(tok->decode({1, 3, 7}), "ab");
}

// --- Utf8Stream -----------------------------------------------------------------------------------

TEST(TokenizerUtf8Stream, SplitsMultibyteAcrossPushes) {
  Utf8Stream s;
  const std::string smile = "\xF0\x9F\x99\x82";
  EXPECT_EQ(s.push("a"), "a");
  EXPECT_EQ(s.push(smile.substr(0, 1)), "");
  EXPECT_EQ(s.push(smile.substr(1, 2)), "");
  EXPECT_EQ(s.push(smile.substr(3) + "b\xC3"), smile + "b");
  EXPECT_EQ(s.push("\xA9"), "\xC3\xA9");
  EXPECT_EQ(s.flush(), "");
}

TEST(TokenizerUtf8Stream, InvalidBytesBecomeReplacement) {
  const std::string r = "\xEF\xBF\xBD";
  auto run = [](const std::string& bytes) {
    Utf8Stream s;
    std::string out = s.push(bytes);
    return out + s.flush();
  };
  EXPECT_EQ(run("a\xFF" "b"), "a" + r + "b");
  EXPECT_EQ(run("\x80\x80"), r + r);                    // lone continuation bytes
  EXPECT_EQ(run("\xC0\xAF"), r + r);                    // overlong
  EXPECT_EQ(run("\xED\xA0\x80"), r + r + r);            // surrogate
  EXPECT_EQ(run("\xF4\x90\x80\x80"), r + r + r + r);    // above U+10FFFF
  EXPECT_EQ(run("\xE2\x82" "x"), r + "x");              // truncated 3-byte sequence: one U+FFFD
  EXPECT_EQ(run("\xF0\x9F\x99"), r);                    // cut off at the end: flush gives one U+FFFD
  EXPECT_EQ(run("\xE2\x82\xAC"), "\xE2\x82\xAC");       // euro sign
  Utf8Stream s;
  EXPECT_EQ(s.push("\xE2"), "");
  EXPECT_EQ(s.push("\xE2\x82\xAC"), r + "\xE2\x82\xAC");  // a new lead byte ends the old sequence
  EXPECT_EQ(s.push("\xC3"), "");
  EXPECT_EQ(s.flush(), r);
  EXPECT_EQ(s.push("ok"), "ok");  // usable after flush
}

}  // namespace
}  // namespace mk
