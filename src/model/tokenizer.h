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
#include <string>
#include <string_view>
#include <vector>

namespace mk {

class ModelFile;
class MappedFile;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes text; prepends BOS when add_bos and the tokenizer has one.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos) const = 0;
  // Raw bytes of one token in context: `prev` is the token before it (-1 at the start); SentencePiece
  // drops the dummy-prefix space of the first piece after BOS (and, when the vocab adds a dummy
  // prefix, of the first piece of the text, prev == -1, so decode(encode(s, false)) == s).
  // Control tokens (BOS, EOS, unknown) give "". Throws mk::Error for an id outside [0, n_vocab).
  virtual std::string token_bytes(int32_t prev, int32_t id) const = 0;
  virtual int32_t n_vocab() const = 0;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  std::vector<int32_t> extra_eos_ids;  // e.g. generation_config.json lists several
  bool is_eos(int32_t id) const;
  // Whether a prompt starts with BOS / ends with EOS (GGUF tokenizer.ggml.add_bos_token /
  // add_eos_token, as llama.cpp's tokenize with add_special applies them). Default: BOS only.
  bool add_bos_token = true;
  bool add_eos_token = false;
  // A prompt as the model expects it: encode(text, add_bos_token), then EOS when add_eos_token.
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
// GGUF: tokenizer.ggml.model must be "llama"; reads .tokens, .scores, .token_type (optional),
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
// <model.path>/tokenizer.json of an HF directory, with EOS ids from its generation_config.json/config.json.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const ModelFile& model);

}  // namespace mk
