// Tokenizers: text <-> token ids.
//
// Implementations: SentencePiece-style BPE with scores and byte fallback (llama2.c tokenizer.bin,
// GGUF `tokenizer.ggml.model == "llama"`), and Hugging Face tokenizer.json (byte-level BPE and
// SentencePiece-style BPE). Decoding goes through token_bytes(): the raw bytes a token stands for
// (byte-fallback tokens give one byte, which may be part of a UTF-8 sequence); Utf8Stream turns a
// stream of such bytes into valid UTF-8 text.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace mk {

class ModelFile;
class MappedFile;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes text; with add_bos, adds the vocabulary's special tokens: BOS in front (when the
  // tokenizer has one and its `add_bos` is set) and EOS at the end (when `add_eos` is set).
  // parse_special: control/special tokens written in the text (e.g. "<|im_start|>") become their
  // ids, as llama.cpp's parse_special; without it they are encoded as plain text. User-defined
  // (non-special) added tokens always match. SentencePiece: GGUF vocabularies match their control and
  // unknown pieces (parse_special) and user-defined ones (always) as llama.cpp does, each run of text
  // between them with its own dummy prefix; a llama2.c tokenizer.bin (no token types) matches none.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = true) const = 0;
  // Raw bytes of one token in context: `prev` is the token before it (-1 at the start); SentencePiece
  // drops the dummy-prefix space of the first piece after BOS (and, when the vocab adds a dummy
  // prefix, of the first piece of the text, prev == -1, so decode(encode(s, false)) == s).
  // Control tokens (BOS, EOS, unknown) give "". Throws mk::Error for an id outside [0, n_vocab).
  virtual std::string token_bytes(int32_t prev, int32_t id) const = 0;
  virtual int32_t n_vocab() const = 0;
  // The token as `tokenize` shows it: token_bytes(-1, id), except that control/special tokens give
  // their literal text ("<|im_end|>") instead of "".
  virtual std::string token_text(int32_t id) const { return token_bytes(-1, id); }
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  bool add_bos = true;   // GGUF tokenizer.ggml.add_bos_token (llama.cpp: default false for gpt2 vocabs)
  bool add_eos = false;  // GGUF tokenizer.ggml.add_eos_token
  // End-of-generation ids besides eos_id: generation_config.json lists several; GGUF: EOT, EOM and
  // control tokens named like an end of turn (<|im_end|>, <|eot_id|>, <end_of_turn>, ...).
  std::vector<int32_t> extra_eos_ids;
  bool is_eos(int32_t id) const;
  // A prompt as the model expects it: encode(text, true), i.e. BOS / EOS as add_bos / add_eos say
  // (GGUF tokenizer.ggml.add_bos_token / add_eos_token, as llama.cpp's tokenize with add_special).
  std::vector<int32_t> encode_prompt(std::string_view text) const;

  // Decodes a whole id sequence to valid UTF-8 (invalid bytes become U+FFFD).
  std::string decode(const std::vector<int32_t>& ids) const;
};

// Buffers bytes until they form complete UTF-8 sequences; invalid sequences become U+FFFD (one per
// maximal ill-formed subpart, as the Unicode standard recommends).
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);  // returns the complete text so far not yet returned
  std::string flush();                       // ends the stream; a dangling partial sequence -> U+FFFD
 private:
  std::string pending_;
};

// SentencePiece-style BPE over scored pieces (llama2.c tokenizer.bin and GGUF "llama" vocab).
// Pieces use U+2581 or plain spaces; byte-fallback pieces are "<0xXX>".
// Encoding: optional BOS; for non-empty text a dummy-prefix space (add_dummy_prefix); split into
// UTF-8 characters; repeatedly merge the adjacent pair whose concatenation is a piece with the
// highest score (ties: leftmost); characters left without a piece become byte-fallback pieces
// (or unk_id). Control, unknown, unused and byte pieces never take part in merges. As in
// SentencePiece, a U+2581 in the input text is the same as a space.
// Throws mk::Error for inconsistent vocabs (sizes differ, ids out of range, NaN scores).
struct SpmVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;  // GGUF token types (1 normal, 2 unknown, 3 control, 6 byte); empty = unknown
  // Per piece (empty = none): a special piece matched in text takes the whitespace after it
  // (llama.cpp's RSTRIP attribute, which it sets for Phi-3 vocabularies).
  std::vector<uint8_t> rstrip;
  int32_t bos_id = 1, eos_id = 2, unk_id = 0;
  bool add_dummy_prefix = true;
};
std::unique_ptr<Tokenizer> make_spm_tokenizer(SpmVocab vocab);

// llama2.c tokenizer.bin: int32 max_token_length, then per token: f32 score, int32 len, bytes.
// Exactly n_vocab tokens (the model's vocab size) must be present, nothing after them. BOS 1,
// EOS 2, unknown 0. Throws mk::Error naming the file, token and offset for a damaged file.
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int32_t n_vocab);
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(std::shared_ptr<MappedFile> file, int32_t n_vocab);
// Tokenizer stored in a model (GGUF tokenizer.ggml.* keys, or tokenizer.json of an HF directory).
// GGUF: tokenizer.ggml.model "gpt2" (load_gguf_bpe_tokenizer below) or "llama", which reads .tokens, .scores, .token_type (optional),
// .bos_token_id, .eos_token_id, .unknown_token_id, .eot_token_id (an extra EOS),
// .add_space_prefix (default true), .add_bos_token (default true), .add_eos_token (default false;
// true needs an EOS id). llama2.c checkpoints carry none: throws, asking for -z.
std::unique_ptr<Tokenizer> load_model_tokenizer(const ModelFile& model);

// Hugging Face tokenizer.json with model.type "BPE" (tokenizer_hf.cpp), in either form:
//  - byte-level BPE (GPT-2, Llama 3, Qwen): ByteLevel and/or Split(regex) pre-tokenizers, every
//    byte mapped to a printable character (GPT-2's bytes_to_unicode), merges by rank;
//  - SentencePiece-style BPE (Llama 2, Mistral, Gemma): spaces become U+2581 (Prepend/Replace
//    normalizers or a Metaspace pre-tokenizer), merges by rank, characters missing from the vocab
//    become <0xXX> byte tokens (byte_fallback) or the unknown token.
// added_tokens are matched first, as whole strings, and never split. BOS is the leading special
// token of a TemplateProcessing post-processor (none otherwise, as with GPT-2). EOS is the first of
// `eos_ids` inside the vocabulary, the others go to extra_eos_ids; without any, a special added
// token with a conventional end name (</s>, <|endoftext|>, <eos>, ...). token_bytes() gives the raw
// bytes; special added tokens give "" and ids past the vocabulary give "".
// Errors (missing file, invalid JSON, unsupported model/normalizer/pre-tokenizer type, merges
// naming tokens outside the vocabulary) throw mk::Error naming the file and the item.
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path, const std::vector<int32_t>& eos_ids = {});
// The same from JSON text in memory; `source` names it in errors.
std::unique_ptr<Tokenizer> parse_hf_tokenizer_json(std::string_view json_text, const std::string& source,
                                                   const std::vector<int32_t>& eos_ids = {});
// The same from a parsed tokenizer.json document (nlohmann::json). The GGUF "gpt2" vocabulary is
// turned into this form, so both share one byte-level BPE implementation.
std::unique_ptr<Tokenizer> make_hf_tokenizer(const nlohmann::json& doc, const std::string& source,
                                             const std::vector<int32_t>& eos_ids = {});
// GGUF `tokenizer.ggml.model == "gpt2"`: byte-level BPE (tokenizer_gguf_bpe.cpp). Reads .tokens,
// .merges ("left right", by rank), .token_type (3 control and 2 unknown: special; 4 user-defined:
// an added token matched in text), .pre (the pre-tokenizer regexes, as llama.cpp names them;
// gguf_bpe_pre_names() lists the known ones; missing: "default"), .bos/.eos/.eot/.eom/
// .unknown_token_id, .add_bos_token (default false, true for llama-bpe), .add_eos_token.
// Throws mk::Error naming the file and key (unknown pre-tokenizer: listing the known ones; merges
// naming tokens outside the vocabulary; ids out of range).
std::unique_ptr<Tokenizer> load_gguf_bpe_tokenizer(const ModelFile& model);
// Token texts llama.cpp treats as end of generation in GGUF vocabularies even without an
// eot_token_id key: <|im_end|>, <|eot_id|>, <|end|>, <end_of_turn>, <|endoftext|>, <|eom_id|>, ...
bool is_end_of_generation_name(std::string_view text);
// llama.cpp's load-time rules for GGUF vocabularies, which the file's token types alone do not say
// (llama-vocab.cpp): a token named like an end of generation is a control token whatever its
// type ("probably a bug in the model", as some Gemma files mark <end_of_turn> user-defined), and
// in a vocabulary whose general.name contains "phi-3" or "phi3" every special token but <unk>,
// <s> and <|endoftext|> takes the whitespace after it when matched in text.
int32_t gguf_token_type_as_llama_cpp(std::string_view text, int32_t type);
bool gguf_vocab_rstrips_specials(const ModelFile& model);  // the Phi-3 rule: general.name
bool gguf_special_rstrips(bool vocab_rstrips, std::string_view text);  // and this token is not exempt
std::vector<std::string> gguf_bpe_pre_names();
// <model.path>/tokenizer.json of an HF directory, with EOS ids from its generation_config.json/config.json.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const ModelFile& model);

}  // namespace mk
