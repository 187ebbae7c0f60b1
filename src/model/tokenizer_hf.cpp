// Hugging Face tokenizer.json, model type "BPE" (see tokenizer.h for the supported forms).
//
// Encoding follows the `tokenizers` library's pipeline: split the text at added tokens, then for
// each remaining segment run the normalizer, the pre-tokenizer (which cuts it into pieces), map the
// bytes of each piece to characters when byte-level, and apply BPE merges by rank inside each piece.
// Format reference: https://huggingface.co/docs/tokenizers/api/ (normalizers, pre-tokenizers,
// models, post-processors, decoders).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "model/hf.h"
#include "model/model_file.h"
#include "model/tokenizer.h"
#include "model/unicode_text.h"
#include "support/error.h"
#include "support/json.h"

namespace mk {

namespace {

using Json = nlohmann::json;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// The pre-tokenizer regex of GPT-2 (used by the ByteLevel pre-tokenizer when use_regex is set).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------------
// UTF-8 helpers

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid.
size_t utf8_seq_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F;
  else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F;
  else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

void check_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_seq_len(s, i);
    if (n == 0)  // a SentencePiece vocabulary takes such bytes as byte tokens; a BPE one reads text only
      fail("tokenizer: the text is not valid UTF-8 (byte 0x{:02x} at offset {}); this model's BPE vocabulary reads "
           "UTF-8 text only",
           static_cast<unsigned char>(s[i]), i);
    i += n;
  }
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes the (valid) UTF-8 sequence at s[i] of length n.
uint32_t utf8_decode(std::string_view s, size_t i, size_t n) {
  uint32_t cp = static_cast<uint8_t>(s[i]);
  if (n == 1) return cp;
  cp &= (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  return cp;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out.append(to);
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

// ---------------------------------------------------------------------------------------------
// Byte-level alphabet (GPT-2): printable Latin-1 bytes stand for themselves, the other 68 bytes are
// mapped in order to U+0100.. so that every byte is a visible character in the vocabulary.

struct ByteAlphabet {
  std::array<std::string, 256> byte_to_utf8;
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteAlphabet() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? b : next++;
      append_utf8(byte_to_utf8[b], cp);
      cp_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

// ---------------------------------------------------------------------------------------------
// PCRE2 regex (UTF + Unicode properties), compiled once, matched with per-call match data.

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& source) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                          &err_off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      fail("{}: cannot compile regex {:?} at offset {}: {}", source, clip(pattern, 200), err_off, reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is the fallback
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty matches [begin, end) in `s` (valid UTF-8), left to right, non-overlapping.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    MK_CHECK(md != nullptr);
    size_t pos = 0;
    while (pos <= s.size()) {
      int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK, md,
                           nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        fail("tokenizer: regex match failed: {}", reinterpret_cast<char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e > b) {
        out.emplace_back(b, e);
        pos = e;
      } else {  // empty match: step over one character
        if (b >= s.size()) break;
        size_t n = utf8_seq_len(s, b);
        pos = b + (n ? n : 1);
      }
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

// How a Split pre-tokenizer treats the matched delimiters (tokenizers' SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

SplitBehavior parse_behavior(const std::string& s, const std::string& source) {
  if (s == "Removed") return SplitBehavior::Removed;
  if (s == "Isolated") return SplitBehavior::Isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (s == "Contiguous") return SplitBehavior::Contiguous;
  fail("{}: unsupported split behavior {}", source, clip(s));
}

// Cuts `s` at the given matches. Gaps between matches are kept as pieces; matches are dropped,
// kept alone, or glued to a neighbour according to `behavior`.
void split_at(std::string_view s, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
              SplitBehavior behavior, std::vector<std::string>& out) {
  struct Seg {
    size_t b, e;
    bool delim;
  };
  std::vector<Seg> segs;
  size_t pos = 0;
  for (auto [b, e] : matches) {
    if (b > pos) segs.push_back({pos, b, invert});
    segs.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < s.size()) segs.push_back({pos, s.size(), invert});

  std::vector<Seg> pieces;
  bool glue_next = false;  // MergedWithNext: the previous delimiter waits for the following piece
  for (const Seg& g : segs) {
    switch (behavior) {
      case SplitBehavior::Removed:
        if (!g.delim) pieces.push_back(g);
        break;
      case SplitBehavior::Isolated: pieces.push_back(g); break;
      case SplitBehavior::Contiguous:
        if (g.delim && !pieces.empty() && pieces.back().delim && pieces.back().e == g.b) pieces.back().e = g.e;
        else pieces.push_back(g);
        break;
      case SplitBehavior::MergedWithPrevious:
        if (g.delim && !pieces.empty() && !pieces.back().delim) pieces.back().e = g.e, pieces.back().delim = true;
        else pieces.push_back(g);
        break;
      case SplitBehavior::MergedWithNext:
        if (glue_next) pieces.back().e = g.e, pieces.back().delim = g.delim;
        else pieces.push_back(g);
        glue_next = g.delim;
        break;
    }
  }
  for (const Seg& g : pieces)
    if (g.e > g.b) out.emplace_back(s.substr(g.b, g.e - g.b));
}

// ---------------------------------------------------------------------------------------------
// Pipeline steps parsed from tokenizer.json.

struct NormStep {
  enum Kind { Prepend, ReplaceString, ReplaceRegex, Unicode, Lowercase, Strip, StripAccents } kind;
  std::string a, b;  // Prepend: a = prefix; Replace: a = pattern, b = content
  std::shared_ptr<Regex> regex;
  UnicodeForm form = UnicodeForm::NFC;  // Unicode
  bool left = false, right = false;     // Strip
};

struct PreStep {
  enum Kind { Split, ByteLevel, Metaspace } kind = Split;
  std::shared_ptr<Regex> regex;  // Split; ByteLevel with use_regex
  std::string literal;           // Split with a String pattern
  bool invert = false;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool add_prefix_space = false;  // ByteLevel
  std::string replacement;        // Metaspace
  std::string prepend_scheme = "always";
  bool split = true;
};

// An added token and its flags, as tokenizers' AddedToken: single_word (match only when neither
// neighbour is a word character), lstrip/rstrip (the match takes the whitespace on that side),
// normalized (matched in the normalized text rather than the raw input), special (skipped when
// decoding).
struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, single_word, normalized;
  std::string pattern = {};  // what is matched: content, normalized when `normalized`
};

// A cut of a text by added-token matches: [b, e) is an added token when id >= 0, else plain text.
struct AddedSplit {
  int32_t id;
  size_t b, e;
};

// The code point ending at byte `end` / starting at byte `begin` of valid UTF-8.
char32_t cp_before(std::string_view s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
  return utf8_decode(s, b, end - b);
}
char32_t cp_at(std::string_view s, size_t begin) {
  size_t n = utf8_seq_len(s, begin);
  return utf8_decode(s, begin, n ? n : 1);
}
size_t cp_len_at(std::string_view s, size_t begin) {
  size_t n = utf8_seq_len(s, begin);
  return n ? n : 1;
}

// A word character as in regex \w (Unicode): letters, marks, decimal and letter numbers, connector
// punctuation, ZWNJ/ZWJ; what tokenizers' single_word tests the neighbours of a match against.
bool is_word_character(char32_t c) {
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC: return true;
    default: return false;
  }
}

class HfBpeTokenizer final : public Tokenizer {
 public:
  HfBpeTokenizer(const Json& j, const std::string& source, const std::vector<int32_t>& eos_ids);

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_bytes(int32_t prev, int32_t id) const override;
  std::string token_text(int32_t id) const override {
    if (id >= 0 && static_cast<size_t>(id) < is_special_.size() && is_special_[static_cast<size_t>(id)])
      return id_to_token_[static_cast<size_t>(id)];
    return token_bytes(-1, id);
  }
  int32_t n_vocab() const override { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  void parse_model(const Json& m);
  void parse_added(const Json& added);
  void index_added();
  void parse_normalizer(const Json& n);
  void parse_pre_tokenizer(const Json& p);
  void parse_decoder(const Json& d);
  void parse_post_processor(const Json& p);
  void pick_eos(const std::vector<int32_t>& eos_ids);

  std::vector<AddedSplit> split_added(std::string_view s, bool normalized, bool parse_special) const;
  std::string normalize(std::string text) const;
  void encode_segment(std::string_view segment, bool at_start, std::vector<int32_t>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  int32_t lookup(std::string_view token) const {
    auto it = token_to_id_.find(std::string(token));
    return it == token_to_id_.end() ? -1 : it->second;
  }

  std::string source_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  struct Merge {
    int32_t rank, merged;
  };
  std::unordered_map<uint64_t, Merge> merges_;
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_token_{};  // <0xXX> ids, -1 when absent

  std::vector<AddedToken> added_;                          // longest first
  std::array<std::vector<uint32_t>, 256> added_by_byte_;   // indices into added_, by first byte
  std::vector<bool> is_added_, is_special_;  // by id
  std::vector<NormStep> normalizer_;
  std::vector<PreStep> pre_tokenizer_;
  bool byte_level_ = false;        // bytes mapped to the GPT-2 alphabet before BPE / back on decode
  std::string space_replacement_;  // SentencePiece style: the character standing for a space
  int strip_leading_spaces_ = 0;   // decoder Strip / Metaspace: drop the dummy prefix on decode
  bool template_seen_ = false;
  int32_t template_eos_id_ = -1;   // the token a TemplateProcessing appends after $A
};

HfBpeTokenizer::HfBpeTokenizer(const Json& j, const std::string& source, const std::vector<int32_t>& eos_ids)
    : source_(source) {
  if (!j.is_object()) fail("{}: not a JSON object", source_);
  if (!j.contains("model") || !j["model"].is_object()) fail("{}: missing model object", source_);
  byte_token_.fill(-1);
  parse_model(j["model"]);
  if (j.contains("added_tokens")) parse_added(j["added_tokens"]);
  if (j.contains("normalizer")) parse_normalizer(j["normalizer"]);
  index_added();
  if (j.contains("pre_tokenizer")) parse_pre_tokenizer(j["pre_tokenizer"]);
  if (j.contains("decoder")) parse_decoder(j["decoder"]);
  if (j.contains("post_processor")) parse_post_processor(j["post_processor"]);

  if (byte_fallback_)
    for (int b = 0; b < 256; ++b) byte_token_[b] = lookup(fmt::format("<0x{:02X}>", b));
  pick_eos(eos_ids);
  if (template_eos_id_ >= 0) {
    // The template appends a token to every prompt: it must be the EOS token, which encode appends when add_eos is set.
    if (eos_id < 0) eos_id = template_eos_id_;
    if (template_eos_id_ != eos_id)
      fail("{}: post_processor appends token {} which is not the EOS token {} (not supported)", source_,
           template_eos_id_, eos_id);
    add_eos = true;
  }
}

void HfBpeTokenizer::parse_model(const Json& m) {
  std::string type;
  if (m.contains("type") && m["type"].is_string()) type = m["type"].get<std::string>();
  else if (m.contains("merges")) type = "BPE";  // older files omit the type
  if (type != "BPE")
    fail("{}: unsupported tokenizer model type {} (supported: BPE)", source_, type.empty() ? "<missing>" : clip(type));

  if (!m.contains("vocab") || !m["vocab"].is_object()) fail("{}: model.vocab missing or not an object", source_);
  constexpr int64_t kMaxId = 1 << 24;
  std::vector<bool> vocab_seen;
  for (const auto& [tok, idv] : m["vocab"].items()) {
    if (!idv.is_number_integer() || idv.get<int64_t>() < 0 || idv.get<int64_t>() >= kMaxId)
      fail("{}: model.vocab id of token {:?} is not a valid id", source_, clip(tok));
    int32_t id = static_cast<int32_t>(idv.get<int64_t>());
    if (static_cast<size_t>(id) >= id_to_token_.size()) {
      id_to_token_.resize(static_cast<size_t>(id) + 1);
      vocab_seen.resize(static_cast<size_t>(id) + 1);
    }
    // Two tokens with one id would make decoding depend on which came last: refuse.
    if (vocab_seen[id])
      fail("{}: model.vocab gives id {} to both {:?} and {:?}", source_, id, clip(id_to_token_[id]), clip(tok));
    vocab_seen[id] = true;
    id_to_token_[id] = tok;
    token_to_id_[tok] = id;
  }

  auto flag = [&](const char* key) { return m.contains(key) && m[key].is_boolean() && m[key].get<bool>(); };
  // BPE dropout makes encoding random: nothing an inference engine should reproduce silently.
  if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"].get<double>() == 0))
    fail("{}: model.dropout {} is not supported (BPE dropout randomises encoding)", source_, clip_json(m["dropout"]));
  byte_fallback_ = flag("byte_fallback");
  fuse_unk_ = flag("fuse_unk");
  ignore_merges_ = flag("ignore_merges");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(key) && m[key].is_string() && !m[key].get<std::string>().empty())
      fail("{}: model.{} is not supported", source_, key);
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    unk_id = lookup(m["unk_token"].get<std::string>());
    if (unk_id < 0) fail("{}: unk_token {:?} is not in the vocabulary", source_, clip(m["unk_token"].get<std::string>()));
  }

  if (!m.contains("merges")) return;
  if (!m["merges"].is_array()) fail("{}: model.merges is not an array", source_);
  int32_t rank = 0;
  for (const auto& mg : m["merges"]) {
    std::string a, b;
    if (mg.is_string()) {  // "left right"
      const std::string s = mg.get<std::string>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail("{}: merge {:?} is not two tokens separated by one space", source_, clip(s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {  // ["left", "right"]
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    } else {
      fail("{}: merge {} is neither \"a b\" nor [a, b]", source_, clip_json(mg));
    }
    int32_t ia = lookup(a), ib = lookup(b), im = lookup(a + b);
    if (ia < 0 || ib < 0 || im < 0)
      fail("{}: merge {:?} {:?} uses a token missing from the vocabulary", source_, clip(a), clip(b));
    // A pair listed twice has two ranks (tokenizers keeps the last, other readers the first): refuse.
    if (!merges_.try_emplace(pair_key(ia, ib), Merge{rank, im}).second)
      fail("{}: merge {:?} {:?} is listed twice (ranks {} and {})", source_, clip(a), clip(b),
           merges_.at(pair_key(ia, ib)).rank, rank);
    ++rank;
  }
}

void HfBpeTokenizer::parse_added(const Json& added) {
  if (added.is_null()) return;
  if (!added.is_array()) fail("{}: added_tokens is not an array", source_);
  for (const auto& t : added) {
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
        !t["content"].is_string())
      fail("{}: added token {} needs an integer id and a string content", source_, clip_json(t));
    int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id >= (1 << 24)) fail("{}: added token id {} out of range", source_, id);
    auto flag = [&](const char* key) { return t.contains(key) && t[key].is_boolean() && t[key].get<bool>(); };
    // tokenizers' defaults: normalized = !special when absent.
    const bool special = flag("special");
    const bool normalized = t.contains("normalized") && t["normalized"].is_boolean() ? t["normalized"].get<bool>() : !special;
    AddedToken a{t["content"].get<std::string>(), static_cast<int32_t>(id), special, flag("lstrip"), flag("rstrip"),
                 flag("single_word"), normalized};
    if (a.content.empty()) fail("{}: added token {} has empty content", source_, id);
    // An added token that names an existing id or content must name the same token there.
    if (static_cast<size_t>(id) < id_to_token_.size() && !id_to_token_[id].empty() && id_to_token_[id] != a.content)
      fail("{}: added token {:?} has id {}, which the vocabulary gives to {:?}", source_, clip(a.content), id,
           clip(id_to_token_[id]));
    if (auto it = token_to_id_.find(a.content); it != token_to_id_.end() && it->second != a.id)
      fail("{}: added token {:?} has id {}, but it is already id {}", source_, clip(a.content), id, it->second);
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(static_cast<size_t>(id) + 1);
    id_to_token_[id] = a.content;
    token_to_id_.try_emplace(a.content, a.id);
    added_.push_back(std::move(a));
  }
  is_added_.assign(id_to_token_.size(), false);
  is_special_.assign(id_to_token_.size(), false);
  for (const auto& a : added_) {
    is_added_[a.id] = true;
    is_special_[a.id] = a.special;
  }
}

// The text each added token is matched as: its content, or for normalized tokens the normalized
// content (tokenizers' refresh_added_tokens); longest first, indexed by first byte.
void HfBpeTokenizer::index_added() {
  for (auto& a : added_) a.pattern = a.normalized ? normalize(a.content) : a.content;
  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& x, const AddedToken& y) { return x.pattern.size() > y.pattern.size(); });
  for (size_t i = 0; i < added_.size(); ++i)
    if (!added_[i].pattern.empty())
      added_by_byte_[static_cast<uint8_t>(added_[i].pattern[0])].push_back(static_cast<uint32_t>(i));
}

void HfBpeTokenizer::parse_normalizer(const Json& n) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : n.value("normalizers", Json::array())) parse_normalizer(s);
  } else if (type == "Prepend") {
    normalizer_.push_back({NormStep::Prepend, n.value("prepend", ""), "", nullptr});
  } else if (type == "Replace") {
    const Json& pat = n.contains("pattern") ? n["pattern"] : Json();
    const std::string content = n.value("content", "");
    if (pat.contains("String") && pat["String"].is_string()) {
      normalizer_.push_back({NormStep::ReplaceString, pat["String"].get<std::string>(), content, nullptr});
    } else if (pat.contains("Regex") && pat["Regex"].is_string()) {
      const std::string re = pat["Regex"].get<std::string>();
      normalizer_.push_back({NormStep::ReplaceRegex, re, content, std::make_shared<Regex>(re, source_)});
    } else {
      fail("{}: Replace normalizer without a String or Regex pattern", source_);
    }
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    NormStep st{NormStep::Unicode, "", "", nullptr};
    st.form = type == "NFC" ? UnicodeForm::NFC : type == "NFD" ? UnicodeForm::NFD : type == "NFKC" ? UnicodeForm::NFKC : UnicodeForm::NFKD;
    normalizer_.push_back(std::move(st));
  } else if (type == "Lowercase") {
    normalizer_.push_back({NormStep::Lowercase, "", "", nullptr});
  } else if (type == "StripAccents") {
    normalizer_.push_back({NormStep::StripAccents, "", "", nullptr});
  } else if (type == "Strip") {
    NormStep st{NormStep::Strip, "", "", nullptr};
    st.left = n.value("strip_left", true);
    st.right = n.value("strip_right", true);
    normalizer_.push_back(std::move(st));
  } else if (type == "BertNormalizer" || type == "Precompiled" || type == "Nmt" || type == "ByteLevel") {
    // Named here so the refusal is explicit: each changes the text in ways not implemented here
    // (BERT cleaning and CJK padding, SentencePiece's compiled charsmap, NMT control-character
    // rules, the byte-to-character map as a normalizer).
    fail("{}: normalizer {} is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
         "StripAccents, Replace, Prepend)", source_, type);
  } else {
    fail("{}: unsupported normalizer type {}", source_, type.empty() ? "<missing>" : clip(type));
  }
}

void HfBpeTokenizer::parse_pre_tokenizer(const Json& p) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : p.value("pretokenizers", Json::array())) parse_pre_tokenizer(s);
  } else if (type == "ByteLevel") {
    PreStep s;
    s.kind = PreStep::ByteLevel;
    s.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Pattern, source_);
    pre_tokenizer_.push_back(std::move(s));
    byte_level_ = true;
  } else if (type == "Split") {
    PreStep s;
    s.kind = PreStep::Split;
    const Json& pat = p.contains("pattern") ? p["pattern"] : Json();
    if (pat.contains("Regex") && pat["Regex"].is_string())
      s.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(), source_);
    else if (pat.contains("String") && pat["String"].is_string() && !pat["String"].get<std::string>().empty())
      s.literal = pat["String"].get<std::string>();
    else
      fail("{}: Split pre-tokenizer without a String or Regex pattern", source_);
    s.behavior = parse_behavior(p.value("behavior", "Isolated"), source_);
    s.invert = p.value("invert", false);
    pre_tokenizer_.push_back(std::move(s));
  } else if (type == "Digits") {
    PreStep s;
    s.kind = PreStep::Split;
    s.regex = std::make_shared<Regex>(p.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)", source_);
    pre_tokenizer_.push_back(std::move(s));
  } else if (type == "Metaspace") {
    PreStep s;
    s.kind = PreStep::Metaspace;
    s.replacement = p.value("replacement", std::string(kMetaspace));
    // The splitting loop advances by the replacement's length: an empty one never ends.
    if (s.replacement.empty()) fail("{}: Metaspace pre_tokenizer replacement must not be empty", source_);
    if (p.contains("prepend_scheme") && p["prepend_scheme"].is_string())
      s.prepend_scheme = p["prepend_scheme"].get<std::string>();
    else
      s.prepend_scheme = p.value("add_prefix_space", true) ? "always" : "never";
    if (s.prepend_scheme != "always" && s.prepend_scheme != "first" && s.prepend_scheme != "never")
      fail("{}: unsupported Metaspace prepend_scheme {}", source_, clip(s.prepend_scheme));
    s.split = p.value("split", true);
    space_replacement_ = s.replacement;
    pre_tokenizer_.push_back(std::move(s));
  } else {
    fail("{}: unsupported pre_tokenizer type {}", source_, type.empty() ? "<missing>" : clip(type));
  }
}

void HfBpeTokenizer::parse_decoder(const Json& d) {
  if (d.is_null()) return;
  const std::string type = d.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : d.value("decoders", Json::array())) parse_decoder(s);
  } else if (type == "ByteLevel") {
    byte_level_ = true;
  } else if (type == "ByteFallback") {
    byte_fallback_ = true;
  } else if (type == "Replace") {
    // SentencePiece decoders replace the space stand-in back to " ".
    const Json& pat = d.contains("pattern") ? d["pattern"] : Json();
    if (!pat.contains("String") || !pat["String"].is_string() || pat["String"].get<std::string>().empty() ||
        d.value("content", "") != " ")
      fail("{}: decoder Replace {} is not supported (only a non-empty String replaced by \" \")", source_, clip_json(d));
    space_replacement_ = pat["String"].get<std::string>();
  } else if (type == "Strip") {
    if (d.value("content", "") != " " || d.value("stop", 0) != 0 || d.value("start", 0) < 0)
      fail("{}: decoder Strip {} is not supported (only leading spaces)", source_, clip_json(d));
    strip_leading_spaces_ = d.value("start", 0);
  } else if (type == "Metaspace") {
    space_replacement_ = d.value("replacement", std::string(kMetaspace));
    if (space_replacement_.empty()) fail("{}: Metaspace decoder replacement must not be empty", source_);
    std::string scheme = d.contains("prepend_scheme") && d["prepend_scheme"].is_string()
                             ? d["prepend_scheme"].get<std::string>()
                             : (d.value("add_prefix_space", true) ? "always" : "never");
    if (scheme != "never") strip_leading_spaces_ = 1;
  } else if (type == "Fuse") {
    // Joins the pieces into one string: nothing changes for per-token bytes.
  } else {
    fail("{}: decoder {} is not supported (supported: ByteLevel, ByteFallback, Replace, Strip, Metaspace, Fuse, "
         "Sequence)", source_, type.empty() ? "<missing>" : clip(type));
  }
}

void HfBpeTokenizer::parse_post_processor(const Json& p) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : p.value("processors", Json::array())) parse_post_processor(s);
  } else if (type == "ByteLevel") {
    // Trims offsets only; the ids are unchanged.
  } else if (type == "TemplateProcessing") {
    // The single-sequence template: optional special tokens before $A (one: BOS) and after it
    // (one: EOS, appended to prompts); anything else is refused rather than dropped.
    if (template_seen_) fail("{}: post_processor holds two TemplateProcessing steps", source_);
    template_seen_ = true;
    const Json single = p.value("single", Json::array());
    const Json specials = p.value("special_tokens", Json::object());
    auto special_id = [&](const std::string& name) {
      int32_t id = -1;
      if (specials.contains(name) && specials[name].contains("ids") && specials[name]["ids"].is_array()) {
        if (specials[name]["ids"].size() != 1 || !specials[name]["ids"][0].is_number_integer())
          fail("{}: post_processor special token {:?} must stand for exactly one id", source_, clip(name));
        id = specials[name]["ids"][0].get<int32_t>();
      } else {
        id = lookup(name);
      }
      if (id < 0 || id >= n_vocab()) fail("{}: post_processor token {:?} is not in the vocabulary", source_, clip(name));
      return id;
    };
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (const auto& item : single) {
      if (item.contains("Sequence")) {
        if (seen_sequence || item["Sequence"].value("id", "A") != "A")
          fail("{}: post_processor template {} is not supported", source_, clip_json(single));
        seen_sequence = true;
      } else if (item.contains("SpecialToken")) {
        (seen_sequence ? after : before).push_back(special_id(item["SpecialToken"].value("id", "")));
      } else {
        fail("{}: post_processor template item {} is not supported", source_, clip_json(item));
      }
    }
    if (before.size() > 1 || after.size() > 1)
      fail("{}: post_processor template {} adds more than one token at an end (not supported)", source_,
           clip_json(single));
    if (!before.empty()) bos_id = before[0];
    else add_bos = false;
    if (!after.empty()) template_eos_id_ = after[0];
  } else {
    fail("{}: post_processor {} is not supported (supported: TemplateProcessing, ByteLevel, Sequence)", source_,
         type.empty() ? "<missing>" : clip(type));
  }
}

void HfBpeTokenizer::pick_eos(const std::vector<int32_t>& eos_ids) {
  for (int32_t id : eos_ids) {
    if (id < 0 || id >= n_vocab()) continue;  // configs sometimes name ids of a larger vocabulary
    if (eos_id < 0) eos_id = id;
    else extra_eos_ids.push_back(id);
  }
  if (eos_id >= 0) return;
  for (const char* name : {"</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>", "<|im_end|>", "<|eot_id|>"})
    for (const auto& a : added_)
      if (a.special && a.content == name) {
        eos_id = a.id;
        return;
      }
}

// --- encoding --------------------------------------------------------------------------------

// tokenizers' AddedVocabulary::find_matches: leftmost-longest matches of the added tokens whose
// `normalized` flag is `normalized`; a single_word match next to a word character is dropped (the
// search goes on after it), lstrip/rstrip widen a match over the whitespace beside it.
std::vector<AddedSplit> HfBpeTokenizer::split_added(std::string_view s, bool normalized, bool parse_special) const {
  std::vector<AddedSplit> out;
  size_t start_offset = 0, i = 0;
  while (i < s.size()) {
    const AddedToken* hit = nullptr;
    for (uint32_t k : added_by_byte_[static_cast<uint8_t>(s[i])])  // longest first
      if (added_[k].normalized == normalized && (parse_special || !added_[k].special) &&
          s.compare(i, added_[k].pattern.size(), added_[k].pattern) == 0) {
        hit = &added_[k];
        break;
      }
    if (!hit) {
      i += cp_len_at(s, i);
      continue;
    }
    size_t start = i, stop = i + hit->pattern.size();
    i = stop;
    if (hit->single_word) {
      const bool word_before = start > 0 && is_word_character(cp_before(s, start));
      const bool word_after = stop < s.size() && is_word_character(cp_at(s, stop));
      if (word_before || word_after) continue;
    }
    if (hit->lstrip) {
      size_t b = start;
      while (b > 0 && unicode_is_whitespace(cp_before(s, b))) {
        size_t k = b - 1;
        while (k > 0 && (static_cast<uint8_t>(s[k]) & 0xC0) == 0x80) --k;
        b = k;
      }
      start = std::max(b, start_offset);  // spaces an earlier match took stay with it
    }
    if (hit->rstrip)
      while (stop < s.size() && unicode_is_whitespace(cp_at(s, stop))) stop += cp_len_at(s, stop);
    if (start_offset < start) out.push_back({-1, start_offset, start});
    out.push_back({hit->id, start, stop});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({-1, start_offset, s.size()});
  return out;
}

std::vector<int32_t> HfBpeTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  check_utf8(text);
  std::vector<int32_t> out;
  if (add_bos && this->add_bos && bos_id >= 0) out.push_back(bos_id);

  // As tokenizers' extract_and_normalize: added tokens with normalized=false are cut out of the raw
  // text; each remaining piece is normalized, then added tokens with normalized=true are cut out of
  // it; what is left goes through the pre-tokenizer and the model.
  for (const AddedSplit& raw : split_added(text, false, parse_special)) {
    if (raw.id >= 0) {
      out.push_back(raw.id);
      continue;
    }
    const std::string norm = normalize(std::string(text.substr(raw.b, raw.e - raw.b)));
    for (const AddedSplit& piece : split_added(norm, true, parse_special)) {
      if (piece.id >= 0) out.push_back(piece.id);
      else encode_segment(std::string_view(norm).substr(piece.b, piece.e - piece.b), raw.b == 0 && piece.b == 0, out);
    }
  }
  if (add_bos && add_eos && eos_id >= 0) out.push_back(eos_id);
  return out;
}

std::string HfBpeTokenizer::normalize(std::string text) const {
  if (text.empty()) return text;
  for (const auto& n : normalizer_) {
    switch (n.kind) {
      case NormStep::Prepend:
        if (!text.empty()) text = n.a + text;
        break;
      case NormStep::ReplaceString: replace_all(text, n.a, n.b); break;
      case NormStep::ReplaceRegex: {
        std::string r;
        size_t pos = 0;
        for (auto [b, e] : n.regex->find_all(text)) {
          r.append(text, pos, b - pos);
          r.append(n.b);
          pos = e;
        }
        r.append(text, pos, std::string::npos);
        text = std::move(r);
        break;
      }
      case NormStep::Unicode: text = unicode_normalize(text, n.form); break;
      case NormStep::Lowercase: text = unicode_lowercase(text); break;
      case NormStep::Strip: text = unicode_strip(text, n.left, n.right); break;
      case NormStep::StripAccents: text = unicode_strip_accents(text); break;
    }
  }
  return text;
}

// Pre-tokenizer and model on one piece of normalized text.
void HfBpeTokenizer::encode_segment(std::string_view segment, bool at_start, std::vector<int32_t>& out) const {
  if (segment.empty()) return;
  std::string text(segment);

  std::vector<std::string> pieces{std::move(text)};
  for (const auto& step : pre_tokenizer_) {
    std::vector<std::string> next;
    for (auto& piece : pieces) {
      if (piece.empty()) continue;
      switch (step.kind) {
        case PreStep::Split: {
          std::vector<std::pair<size_t, size_t>> matches;
          if (step.regex) {
            matches = step.regex->find_all(piece);
          } else {
            for (size_t p = piece.find(step.literal); p != std::string::npos;
                 p = piece.find(step.literal, p + step.literal.size()))
              matches.emplace_back(p, p + step.literal.size());
          }
          split_at(piece, matches, step.invert, step.behavior, next);
          break;
        }
        case PreStep::ByteLevel: {
          if (step.add_prefix_space && piece.front() != ' ') piece.insert(piece.begin(), ' ');
          if (step.regex) split_at(piece, step.regex->find_all(piece), false, SplitBehavior::Isolated, next);
          else next.push_back(std::move(piece));
          break;
        }
        case PreStep::Metaspace: {
          replace_all(piece, " ", step.replacement);
          const bool prepend = step.prepend_scheme == "always" || (step.prepend_scheme == "first" && at_start);
          if (prepend && piece.compare(0, step.replacement.size(), step.replacement) != 0)
            piece.insert(0, step.replacement);
          if (step.split) {
            std::vector<std::pair<size_t, size_t>> matches;
            for (size_t p = piece.find(step.replacement); p != std::string::npos;
                 p = piece.find(step.replacement, p + step.replacement.size()))
              matches.emplace_back(p, p + step.replacement.size());
            split_at(piece, matches, false, SplitBehavior::MergedWithNext, next);
          } else {
            next.push_back(std::move(piece));
          }
          break;
        }
      }
    }
    pieces = std::move(next);
    pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const std::string& p) { return p.empty(); }),
                 pieces.end());
  }

  const ByteAlphabet& alpha = byte_alphabet();
  for (const auto& piece : pieces) {
    if (!byte_level_) {
      bpe(piece, out);
      continue;
    }
    std::string mapped;
    mapped.reserve(piece.size() * 2);
    for (unsigned char c : piece) mapped += alpha.byte_to_utf8[c];
    bpe(mapped, out);
  }
}

// BPE on one piece: start from its characters, then repeatedly merge the adjacent pair with the
// lowest merge rank (leftmost first on ties) until no pair has a merge. A heap keyed by
// (rank, position) keeps this O(n log n); stale entries are skipped when popped.
void HfBpeTokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    int32_t whole = lookup(word);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }

  std::vector<int32_t> ids;
  for (size_t i = 0; i < word.size();) {
    size_t n = utf8_seq_len(word, i);
    if (n == 0) n = 1;  // cannot happen for validated input; keep going byte by byte
    int32_t id = lookup(word.substr(i, n));
    if (id >= 0) {
      ids.push_back(id);
    } else {
      bool done = false;
      if (byte_fallback_) {
        done = true;
        for (size_t k = 0; k < n; ++k) done = done && byte_token_[static_cast<uint8_t>(word[i + k])] >= 0;
        if (done)
          for (size_t k = 0; k < n; ++k) ids.push_back(byte_token_[static_cast<uint8_t>(word[i + k])]);
      }
      if (!done && unk_id >= 0 && !(fuse_unk_ && !ids.empty() && ids.back() == unk_id)) ids.push_back(unk_id);
      // Without an unknown token the character is dropped, as the tokenizers library does.
    }
    i += n;
  }

  const size_t n = ids.size();
  std::vector<int32_t> prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(pair_key(ids[pos], ids[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, ids[pos], ids[next[pos]]});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || ids[c.pos] != c.left || next[c.pos] < 0 || ids[next[c.pos]] != c.right) continue;
    const int32_t r = next[c.pos];
    ids[c.pos] = merges_.at(pair_key(c.left, c.right)).merged;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int32_t i = n ? 0 : -1; i >= 0; i = next[i]) out.push_back(ids[i]);
}

// --- decoding --------------------------------------------------------------------------------

std::string HfBpeTokenizer::token_bytes(int32_t prev, int32_t id) const {
  if (id < 0 || id >= n_vocab()) return "";
  const size_t uid = static_cast<size_t>(id);
  if (uid < is_added_.size() && is_added_[uid]) return is_special_[uid] ? "" : id_to_token_[uid];
  const std::string& tok = id_to_token_[uid];

  if (byte_level_) {
    const ByteAlphabet& alpha = byte_alphabet();
    std::string out;
    for (size_t i = 0; i < tok.size();) {
      size_t n = utf8_seq_len(tok, i);
      if (n == 0) {  // not UTF-8: pass the byte through
        out += tok[i++];
        continue;
      }
      auto it = alpha.cp_to_byte.find(utf8_decode(tok, i, n));
      if (it != alpha.cp_to_byte.end()) out += static_cast<char>(it->second);
      else out.append(tok, i, n);
      i += n;
    }
    return out;
  }

  if (byte_fallback_ && tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>') {
    unsigned v = 0;
    bool hex = true;
    for (int k = 3; k < 5; ++k) {
      char c = tok[k];
      v = v * 16 + (c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : (hex = false, 0));
    }
    if (hex) return std::string(1, static_cast<char>(v));
  }
  std::string out = tok;
  replace_all(out, space_replacement_.empty() ? kMetaspace : std::string_view(space_replacement_), " ");
  if (strip_leading_spaces_ > 0 && (prev < 0 || prev == bos_id)) {
    size_t k = 0;
    while (k < out.size() && k < static_cast<size_t>(strip_leading_spaces_) && out[k] == ' ') ++k;
    out.erase(0, k);
  }
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> make_hf_tokenizer(const nlohmann::json& doc, const std::string& source,
                                             const std::vector<int32_t>& eos_ids) {
  try {
    return std::make_unique<HfBpeTokenizer>(doc, source, eos_ids);
  } catch (const Json::exception& e) {  // a field of an unexpected JSON type
    fail("{}: malformed tokenizer description: {}", source, json_error_text(e));
  }
}

std::unique_ptr<Tokenizer> parse_hf_tokenizer_json(std::string_view json_text, const std::string& source,
                                                   const std::vector<int32_t>& eos_ids) {
  const Json j = parse_json<Json>(json_text, source);  // nesting-limited, duplicate keys refused
  try {
    return std::make_unique<HfBpeTokenizer>(j, source, eos_ids);
  } catch (const Json::exception& e) {  // a field of an unexpected JSON type
    fail("{}: malformed tokenizer.json: {}", source, clip(json_error_text(e), 200));
  }
}

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path, const std::vector<int32_t>& eos_ids) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", path, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hf_tokenizer_json(ss.str(), path, eos_ids);
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const ModelFile& model) {
  return load_hf_tokenizer_json(model.path + "/tokenizer.json", read_hf_eos_ids(model));
}

}  // namespace mk
