// GGUF "gpt2" vocabulary (byte-level BPE), turned into the tokenizer.json form that
// tokenizer_hf.cpp encodes, so GGUF and Hugging Face files share one BPE implementation.
//
// Keys (ggml docs/gguf.md, "Tokenizer"): tokenizer.ggml.tokens, .merges, .token_type, .pre,
// .bos/.eos/.eot/.eom/.unknown_token_id, .add_bos_token, .add_eos_token. The pre-tokenizer regexes
// per `tokenizer.ggml.pre` name are the ones llama.cpp applies (src/llama-vocab.cpp,
// llm_tokenizer_bpe): each regex splits every piece left by the previous one, keeping both the
// matches and the text between them (tokenizers' Split with behavior Isolated); the pieces are then
// mapped to GPT-2's byte alphabet and merged by rank.
#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "model/model_file.h"
#include "model/tokenizer.h"
#include "support/error.h"
#include "support/printable.h"

namespace mk {

namespace {

// GGUF token types (llama.cpp's llama_token_type).
enum GgufTokenType : int { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// The GPT-2 regex, the base of most families (contractions, letters, digits, other, spaces).
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
// Llama 3 / Qwen2: case-insensitive contractions, a letter run with one leading non-letter, digit
// groups (1-3 for Llama 3, single digits for Qwen2), punctuation with trailing newlines.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Seed-Coder: Qwen2's regex with single digits and no newline after punctuation.
constexpr const char* kSeedCoder =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";
// BLOOM (and Poro, GPT3-Finnish, Viking): an optional space, then a run of anything but whitespace,
// . , ! ? and seven non-ASCII stops and commas (ellipsis, ideographic full stop and comma, fullwidth
// comma, danda, Arabic full stop and comma) -- and ( | ), which BLOOM's tokenizer.json writes
// inside its class as if they were grouping. What the regex does not match (whitespace runs,
// punctuation runs) is kept whole as the text between matches: "x\t\ty" is "x", "\t\t", "y".
constexpr const char* kBloom = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";
// Tekken (Mistral-Nemo) and GPT-4o (Phi-4-mini, Llama 4) split words at case changes. Their
// tokenizer.json classes [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] / [\p{Ll}\p{Lm}\p{Lo}\p{M}] are, as in
// llama.cpp, "a letter other than a-z" / "a letter other than A-Z": any letter outside ASCII counts
// as both cases, and marks are not letters. Tekken keeps single digits and a slash or newlines after
// punctuation; GPT-4o adds the contractions to the word and groups digits by three.
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// DeepSeek LLM: newlines alone; a run of cased letters (the ranges of DeepSeek's tokenizer.json:
// Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee, Glagolitic, Coptic, Deseret, Osage, Old
// Hungarian, Warang Citi, Adlam, ...) with one optional whitespace before it; a run of ASCII and
// full-width punctuation, quotes and CJK stops with one optional whitespace; trailing whitespace;
// a CJK and Hangul run (U+0800..U+9FA5, so Indic and kana too); then digit runs. llama.cpp matches
// these classes on text where each whitespace character outside ASCII stands as \v, so none is
// part of a run: U+3000 is left out of the punctuation range U+3000..U+3002, and the CJK run takes
// no whitespace (U+2009, U+2028, U+3000 are inside U+0800..U+4E00).
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
    R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
constexpr const char* kDeepseekPunct = R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3001}\x{3002}]+)";
constexpr const char* kDeepseekCjk = R"((?:(?!\s)[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}])+)";

// DeepSeek V3 / R1 (after digit groups of 1-3 and a kana / CJK run): a punctuation mark joined to
// the ASCII letters after it, a letter-and-mark run with one leading character that is not a
// newline, letter, punctuation or symbol, punctuation and symbols with trailing newlines, and
// whitespace as Llama 3's.
constexpr const char* kDeepseekV3 =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreTokenizer {
  std::vector<const char*> names;
  std::vector<const char*> regexes;
  bool ignore_merges = false;  // a piece that is a whole vocabulary entry is taken as is
  bool add_bos = false;        // llama.cpp's default when tokenizer.ggml.add_bos_token is absent
};

const std::vector<PreTokenizer>& pre_tokenizers() {
  static const std::vector<PreTokenizer> table = {
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"}, {kLlama3}, true, true},
      {{"dbrx", "smaug-bpe", "chatglm-bpe"}, {kLlama3}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion"}, {kGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {kQwen2}},
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kBloom}},
      {{"viking"}, {kBloom, R"(\p{N})"}},
      {{"seed-coder"}, {kSeedCoder}},
      {{"tekken"}, {kTekken}, true, true},
      {{"gpt-4o", "llama4"}, {kGpt4o}},
      {{"deepseek-llm"}, {R"([\r\n])", kDeepseekLetters, kDeepseekPunct, R"(\s+\z)", kDeepseekCjk, R"(\p{N}+)"}},
      {{"deepseek-coder"}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}},
      {{"deepseek-v3"}, {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)", kDeepseekV3}},
  };
  return table;
}

const nlohmann::ordered_json* array_of(const ModelFile& model, const std::string& key, bool required) {
  if (!model.has(key)) {
    if (required) fail("{}: missing metadata key {}", model.path, key);
    return nullptr;
  }
  const auto& v = model.metadata.at(key);
  if (!v.is_array()) fail("{}: metadata key {} is not an array", model.path, key);
  return &v;
}

bool bool_key(const ModelFile& model, const std::string& key, bool def) {
  if (!model.has(key)) return def;
  const auto& v = model.metadata.at(key);
  if (!v.is_boolean()) fail("{}: metadata key {} is not a boolean", model.path, key);
  return v.get<bool>();
}

// Names llama.cpp treats as end of generation besides the EOS/EOT/EOM ids (llama-vocab.cpp).
constexpr const char* kEndOfGenerationNames[] = {
    "<|eot_id|>", "<|im_end|>",   "<|end|>",         "<end_of_turn>",     "<|endoftext|>", "<|eom_id|>",
    "<EOT>",      "_<EOT>",       "<|end_of_text|>", "<end_of_utterance>", "<|return|>",    "<|call|>"};

}  // namespace

bool is_end_of_generation_name(std::string_view text) {
  return std::find(std::begin(kEndOfGenerationNames), std::end(kEndOfGenerationNames), text) !=
         std::end(kEndOfGenerationNames);
}

int32_t gguf_token_type_as_llama_cpp(std::string_view text, int32_t type) {
  return is_end_of_generation_name(text) ? kControl : type;
}

bool gguf_vocab_rstrips_specials(const ModelFile& model) {
  if (!model.has("general.name") || !model.metadata.at("general.name").is_string()) return false;
  std::string name = model.metadata.at("general.name").get<std::string>();
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos;
}

bool gguf_special_rstrips(bool vocab_rstrips, std::string_view text) {
  return vocab_rstrips && text != "<unk>" && text != "<s>" && text != "<|endoftext|>";
}

std::vector<std::string> gguf_bpe_pre_names() {
  std::vector<std::string> names;
  for (const auto& p : pre_tokenizers())
    for (const char* n : p.names) names.emplace_back(n);
  return names;
}

std::unique_ptr<Tokenizer> load_gguf_bpe_tokenizer(const ModelFile& model) {
  const std::string& path = model.path;
  const auto& tokens = *array_of(model, "tokenizer.ggml.tokens", true);
  const auto& merges = *array_of(model, "tokenizer.ggml.merges", true);
  const auto* types = array_of(model, "tokenizer.ggml.token_type", false);
  const size_t n = tokens.size();
  if (n == 0) fail("{}: tokenizer.ggml.tokens is empty", path);
  if (types && types->size() != n)
    fail("{}: tokenizer.ggml.token_type has {} entries, tokenizer.ggml.tokens {}", path, types->size(), n);

  const std::string pre_name = model.has("tokenizer.ggml.pre") ? model.get_str("tokenizer.ggml.pre") : "default";
  const PreTokenizer* pre = nullptr;
  for (const auto& p : pre_tokenizers())
    if (std::find_if(p.names.begin(), p.names.end(), [&](const char* x) { return pre_name == x; }) != p.names.end())
      pre = &p;
  if (!pre) {
    std::string known;
    for (const auto& name : gguf_bpe_pre_names()) known += (known.empty() ? "" : ", ") + name;
    fail("{}: unknown pre-tokenizer tokenizer.ggml.pre = \"{}\" (known: {})", path, printable(pre_name), known);
  }

  nlohmann::json doc;
  nlohmann::json& m = doc["model"];
  m["type"] = "BPE";
  m["ignore_merges"] = pre->ignore_merges;
  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json added = nlohmann::json::array();
  std::vector<std::string> text(n);
  const bool rstrips = gguf_vocab_rstrips_specials(model);
  for (size_t i = 0; i < n; ++i) {
    if (!tokens[i].is_string()) fail("{}: tokenizer.ggml.tokens[{}] is not a string", path, i);
    text[i] = tokens[i].get<std::string>();
    if (text[i].empty()) fail("{}: tokenizer.ggml.tokens[{}] is empty", path, i);
    int type = kNormal;
    if (types) {
      if (!(*types)[i].is_number_integer()) fail("{}: tokenizer.ggml.token_type[{}] is not an integer", path, i);
      type = (*types)[i].get<int>();
    }
    type = gguf_token_type_as_llama_cpp(text[i], type);
    // A repeated text (some vocabs pad with copies) keeps its id as a special token that the text
    // never produces: the first id with that text is the one encoding gives.
    const bool repeated = vocab.contains(text[i]);
    if (!repeated) vocab[text[i]] = i;
    if (repeated) added.push_back({{"id", i}, {"content", text[i]}, {"special", true}});
    else if (type == kControl || type == kUnknown || type == kUserDefined)
      added.push_back({{"id", i},
                       {"content", text[i]},
                       {"special", type != kUserDefined},
                       {"rstrip", gguf_special_rstrips(rstrips, text[i])}});
  }
  m["vocab"] = std::move(vocab);
  nlohmann::json merge_list = nlohmann::json::array();
  for (size_t i = 0; i < merges.size(); ++i) {
    if (!merges[i].is_string()) fail("{}: tokenizer.ggml.merges[{}] is not a string", path, i);
    merge_list.push_back(merges[i].get<std::string>());
  }
  m["merges"] = std::move(merge_list);
  doc["added_tokens"] = std::move(added);
  nlohmann::json steps = nlohmann::json::array();
  for (const char* re : pre->regexes)
    steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}, {"invert", false}});
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
  doc["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}};
  doc["decoder"] = {{"type", "ByteLevel"}};

  auto id = [&](const char* key) -> int32_t {
    const int64_t v = model.get_int(key, -1);
    if (v < -1 || v >= static_cast<int64_t>(n)) fail("{}: {} = {} is outside the vocabulary [0, {})", path, key, v, n);
    return static_cast<int32_t>(v);
  };
  const int32_t bos = id("tokenizer.ggml.bos_token_id"), eos = id("tokenizer.ggml.eos_token_id");
  const int32_t eot = id("tokenizer.ggml.eot_token_id"), eom = id("tokenizer.ggml.eom_token_id");
  const int32_t unk = id("tokenizer.ggml.unknown_token_id");

  std::vector<int32_t> eog;
  auto add_eog = [&](int32_t t) {
    if (t >= 0 && std::find(eog.begin(), eog.end(), t) == eog.end()) eog.push_back(t);
  };
  add_eog(eos);
  add_eog(eot);
  add_eog(eom);
  for (size_t i = 0; i < n; ++i)
    if (is_end_of_generation_name(text[i])) add_eog(static_cast<int32_t>(i));

  auto tok = make_hf_tokenizer(doc, path + ": tokenizer.ggml", eog);
  tok->bos_id = bos;
  // unknown_token_id is read (and range-checked) but never emitted: a byte the vocabulary has no
  // token for is dropped, as llama.cpp's BPE tokenizer and the tokenizers library (without an
  // unk_token) do. SmolLM2's vocabulary lacks 21 of the 256 bytes and names id 0, <|endoftext|>, as
  // its unknown token: emitting it put a document separator into user text (new-user trial).
  (void)unk;
  tok->add_bos = bool_key(model, "tokenizer.ggml.add_bos_token", pre->add_bos);
  tok->add_eos = bool_key(model, "tokenizer.ggml.add_eos_token", false);
  if (tok->add_bos && bos < 0) {
    if (model.has("tokenizer.ggml.add_bos_token"))
      fail("{}: tokenizer.ggml.add_bos_token is set but there is no bos_token_id", path);
    tok->add_bos = false;  // the pre-tokenizer's default, without a BOS to add
  }
  return tok;
}

}  // namespace mk
