// SentencePiece-style BPE tokenizer (llama2.c tokenizer.bin, GGUF "llama" vocab) and its loaders.
//
// The encoder follows SentencePiece's BPE model (and llama2.c's run.c, which gives the same ids for
// real vocabs): start from UTF-8 characters, then repeatedly merge the adjacent pair whose
// concatenation is a vocab piece with the highest score, the leftmost pair on ties. run.c rescans
// every pair after each merge (quadratic); here the candidate pairs sit in a priority queue keyed
// by (score, position) and the symbols in a linked list, so a merge costs O(log n). A popped
// candidate is stale when either side has since been merged into something else; its recorded
// length then no longer matches and it is dropped. Because the queue holds every live adjacent
// pair and orders them exactly as run.c's scan does, the merge sequence is identical.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <queue>
#include <unordered_map>

#include "model/model_file.h"
#include "model/tokenizer.h"
#include "model/utf8.h"
#include "support/byte_reader.h"
#include "support/error.h"
#include "support/mmap.h"
#include "support/printable.h"

namespace mk {
namespace {

// GGUF token types (llama.cpp's LLAMA_TOKEN_TYPE_*).
enum GgufTokenType : int32_t {
  kTypeNormal = 1,
  kTypeUnknown = 2,
  kTypeControl = 3,
  kTypeUserDefined = 4,
  kTypeUnused = 5,
  kTypeByte = 6,
};

// How a piece behaves when encoding and decoding.
enum class PieceKind : uint8_t {
  kNormal,   // mergeable text
  kSpecial,  // control or unknown: never produced by merges, decodes to ""
  kUnused,   // decodes to its text but is never produced by merges
  kByte,     // byte fallback "<0xXX>": decodes to one byte
};

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// Replaces every U+2581 with a plain space.
std::string spaces_from_markers(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, kSpaceMarker.size(), kSpaceMarker) == 0) {
      out += ' ';
      i += kSpaceMarker.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The byte a "<0xXX>" piece stands for, or -1 when the piece is not of that form.
int parse_byte_piece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  const int hi = hex_digit(piece[3]), lo = hex_digit(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(SpmVocab vocab) : vocab_(std::move(vocab)) {
    const size_t n = vocab_.pieces.size();
    if (n == 0) fail("tokenizer: the vocab is empty");
    if (n > static_cast<size_t>(INT32_MAX)) fail("tokenizer: the vocab has too many pieces ({})", n);
    if (vocab_.scores.size() != n)
      fail("tokenizer: {} pieces but {} scores", n, vocab_.scores.size());
    if (!vocab_.types.empty() && vocab_.types.size() != n)
      fail("tokenizer: {} pieces but {} token types", n, vocab_.types.size());
    check_id(vocab_.bos_id, "bos_id");
    check_id(vocab_.eos_id, "eos_id");
    check_id(vocab_.unk_id, "unk_id");
    bos_id = vocab_.bos_id;
    eos_id = vocab_.eos_id;
    unk_id = vocab_.unk_id;

    // Pieces that match in text before any merge (llama.cpp's tokenizer_st_partition): control and
    // unknown ones with parse_special, user-defined ones always; by their text as stored, longest
    // first (ties: lower id first). Only vocabularies with token types have them (GGUF "llama";
    // a llama2.c tokenizer.bin has none, as run.c matches none).
    for (size_t i = 0; i < vocab_.types.size(); ++i) {
      const int32_t type = vocab_.types[i];
      if ((type == kTypeControl || type == kTypeUnknown || type == kTypeUserDefined) && !vocab_.pieces[i].empty())
        specials_.push_back({vocab_.pieces[i], static_cast<int32_t>(i), type == kTypeUserDefined,
                             i < vocab_.rstrip.size() && vocab_.rstrip[i] != 0});
    }
    std::stable_sort(specials_.begin(), specials_.end(),
                     [](const SpecialPiece& a, const SpecialPiece& b) { return a.text.size() > b.text.size(); });

    kinds_.resize(n);
    byte_values_.assign(n, 0);
    byte_ids_.fill(-1);
    piece_ids_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const auto id = static_cast<int32_t>(i);
      if (std::isnan(vocab_.scores[i])) fail("tokenizer: piece {} has a NaN score", id);
      const int32_t type = vocab_.types.empty() ? 0 : vocab_.types[i];
      const int byte = parse_byte_piece(vocab_.pieces[i]);
      PieceKind kind = PieceKind::kNormal;
      if (id == bos_id || id == eos_id || id == unk_id || type == kTypeControl || type == kTypeUnknown) {
        kind = PieceKind::kSpecial;
      } else if (type == kTypeByte || (vocab_.types.empty() && byte >= 0)) {
        if (byte < 0) fail("tokenizer: piece {} has the byte type but is not of the form <0xXX>", id);
        kind = PieceKind::kByte;
      } else if (type == kTypeUnused) {
        kind = PieceKind::kUnused;
      }
      kinds_[i] = kind;
      if (kind == PieceKind::kByte) {
        byte_values_[i] = static_cast<uint8_t>(byte);
        if (byte_ids_[byte] < 0) byte_ids_[byte] = id;
        continue;
      }
      vocab_.pieces[i] = spaces_from_markers(vocab_.pieces[i]);
    }
    // Index only after every piece is final: the map's keys view the strings in vocab_.pieces.
    // A duplicate piece keeps its first id.
    for (size_t i = 0; i < n; ++i)
      if (kinds_[i] == PieceKind::kNormal) piece_ids_.emplace(vocab_.pieces[i], static_cast<int32_t>(i));
  }

  // piece_ids_ views the strings in vocab_: copying would leave the copy's views dangling.
  SpmTokenizer(const SpmTokenizer&) = delete;
  SpmTokenizer& operator=(const SpmTokenizer&) = delete;

  int32_t n_vocab() const override { return static_cast<int32_t>(vocab_.pieces.size()); }

  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
    std::vector<int32_t> ids;
    if (add_bos && this->add_bos && bos_id >= 0) ids.push_back(bos_id);
    // Special pieces written in the text split it first; each run of text between them is encoded
    // on its own, with the dummy prefix (llama.cpp prefixes a run at the start or after a special
    // token, which is every run).
    for (const Fragment& f : partition(text, parse_special)) {
      if (f.id >= 0) ids.push_back(f.id);
      else encode_text(f.text, ids);
    }
    if (add_bos && add_eos && eos_id >= 0) ids.push_back(eos_id);
    return ids;
  }

  // Control pieces show their text; others their bytes as in mid-text (with the leading space).
  std::string token_text(int32_t id) const override {
    if (id >= 0 && id < n_vocab() && kinds_[id] == PieceKind::kSpecial) return vocab_.pieces[id];
    return token_bytes(/*prev=*/n_vocab(), id);  // a `prev` that is neither the start nor BOS
  }

  std::string token_bytes(int32_t prev, int32_t id) const override {
    if (id < 0 || id >= n_vocab()) fail("tokenizer: token id {} is outside the vocab [0, {})", id, n_vocab());
    switch (kinds_[id]) {
      case PieceKind::kSpecial:
        return {};
      case PieceKind::kByte:
        return std::string(1, static_cast<char>(byte_values_[id]));
      case PieceKind::kNormal:
      case PieceKind::kUnused:
        break;
    }
    std::string_view piece = vocab_.pieces[id];
    // The dummy prefix added by encode() is not part of the text.
    if (vocab_.add_dummy_prefix && (prev < 0 || (prev == bos_id && bos_id >= 0)) && !piece.empty() &&
        piece[0] == ' ')
      piece.remove_prefix(1);
    return std::string(piece);
  }

 private:
  // A piece matched in text before merging: control/unknown (only with parse_special) or user-defined.
  struct SpecialPiece {
    std::string text;  // as stored in the vocabulary (U+2581, not spaces)
    int32_t id;
    bool user_defined;
    bool rstrip;  // takes the whitespace after it (SpmVocab::rstrip)
  };
  // A run of text to encode (id < 0) or a special piece's id.
  struct Fragment {
    std::string_view text;
    int32_t id;
  };

  // llama.cpp's partition: each special piece in turn (longest first) splits every text fragment
  // at its occurrences, left to right (an rstrip piece drops the whitespace after it); empty
  // fragments are dropped.
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const {
    std::vector<Fragment> frags;
    if (!text.empty()) frags.push_back({text, -1});
    if (specials_.empty()) return frags;
    std::array<bool, 256> present{};
    for (char c : text) present[static_cast<uint8_t>(c)] = true;
    for (const SpecialPiece& sp : specials_) {
      if (!parse_special && !sp.user_defined) continue;
      if (!present[static_cast<uint8_t>(sp.text[0])]) continue;
      std::vector<Fragment> next;
      bool split = false;
      for (const Fragment& f : frags) {
        if (f.id >= 0 || f.text.size() < sp.text.size()) {
          next.push_back(f);
          continue;
        }
        size_t from = 0;
        for (size_t at; (at = f.text.find(sp.text, from)) != std::string_view::npos;) {
          if (at > from) next.push_back({f.text.substr(from, at - from), -1});
          next.push_back({{}, sp.id});
          split = true;
          from = at + sp.text.size();
          if (sp.rstrip)  // C isspace, as llama.cpp
            while (from < f.text.size() && std::strchr(" \t\n\v\f\r", f.text[from]) && f.text[from] != '\0') ++from;
        }
        if (from < f.text.size()) next.push_back({f.text.substr(from), -1});
      }
      if (split) frags = std::move(next);
    }
    return frags;
  }

  // One run of text (no special pieces in it): the dummy prefix, then SentencePiece BPE merges.
  void encode_text(std::string_view text, std::vector<int32_t>& ids) const {
    std::string prefixed(vocab_.add_dummy_prefix ? 1 : 0, ' ');
    prefixed += text;
    const std::string normalized = spaces_from_markers(prefixed);
    const std::string_view s = normalized;
    if (s.size() >= UINT32_MAX) fail("tokenizer: text of {} bytes is too long to encode", text.size());

    // Initial symbols: one per UTF-8 character (an ill-formed byte run is one symbol and ends up
    // as byte-fallback pieces, so any byte string round-trips).
    std::vector<Symbol> symbols;
    symbols.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      const size_t len = utf8::scan_sequence(s, i).length;
      const auto index = static_cast<int32_t>(symbols.size());
      symbols.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(len), index - 1, index + 1});
      i += len;
    }
    symbols.back().next = -1;

    std::priority_queue<Candidate> queue;
    auto add_candidate = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = symbols[left];
      const uint32_t len = l.len + symbols[right].len;
      const auto it = piece_ids_.find(s.substr(l.start, len));
      if (it == piece_ids_.end()) return;
      queue.push({vocab_.scores[it->second], l.start, left, right, len});
    };
    for (size_t i = 0; i + 1 < symbols.size(); ++i)
      add_candidate(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));

    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol& left = symbols[c.left];
      Symbol& right = symbols[c.right];
      if (left.len == 0 || right.len == 0 || left.len + right.len != c.len) continue;  // stale
      // Merge right into left and unlink right.
      left.len = c.len;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = c.left;
      right.len = 0;
      add_candidate(left.prev, c.left);
      add_candidate(c.left, left.next);
    }

    for (int32_t i = 0; i >= 0; i = symbols[i].next) {
      const std::string_view piece = s.substr(symbols[i].start, symbols[i].len);
      const auto it = piece_ids_.find(piece);
      if (it != piece_ids_.end()) {
        ids.push_back(it->second);
        continue;
      }
      // No piece for this character: its bytes as byte-fallback pieces when the vocab has them all,
      // else one unknown token (SentencePiece without byte fallback).
      bool have_bytes = true;
      for (char ch : piece) have_bytes = have_bytes && byte_ids_[static_cast<uint8_t>(ch)] >= 0;
      if (have_bytes) {
        for (char ch : piece) ids.push_back(byte_ids_[static_cast<uint8_t>(ch)]);
      } else {
        if (unk_id < 0) fail("tokenizer: cannot encode \"{}\": no piece, no byte fallback and no unknown token", piece);
        ids.push_back(unk_id);
      }
    }
  }

  // A span of the normalized text in the doubly linked list of current symbols; len 0 = merged away.
  struct Symbol {
    uint32_t start, len;
    int32_t prev, next;
  };
  // A possible merge of symbols left and right into a piece of `len` bytes with `score`.
  struct Candidate {
    float score;
    uint32_t start;  // text offset of the left symbol: earlier wins ties
    int32_t left, right;
    uint32_t len;
    bool operator<(const Candidate& o) const {  // "lower priority than" for std::priority_queue
      if (score != o.score) return score < o.score;
      return start > o.start;
    }
  };

  void check_id(int32_t id, const char* field) const {
    if (id < -1 || id >= static_cast<int64_t>(vocab_.pieces.size()))
      fail("tokenizer: {} {} is outside the vocab [0, {})", field, id, vocab_.pieces.size());
  }

  SpmVocab vocab_;  // pieces with plain spaces
  std::vector<PieceKind> kinds_;
  std::vector<uint8_t> byte_values_;  // for kByte pieces
  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<std::string_view, int32_t> piece_ids_;  // mergeable pieces only
  std::vector<SpecialPiece> specials_;  // longest first
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(SpmVocab vocab) { return std::make_unique<SpmTokenizer>(std::move(vocab)); }

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path, int32_t n_vocab) {
  return load_llama2c_tokenizer(MappedFile::open(path), n_vocab);
}

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(std::shared_ptr<MappedFile> file, int32_t n_vocab) {
  const std::string& path = file->path();
  if (n_vocab <= 0) fail("{}: n_vocab must be positive, got {}", path, n_vocab);
  if (file->bytes().size() >= 4 && std::memcmp(file->bytes().data(), "GGUF", 4) == 0)
    fail("{}: this is a GGUF file, not a llama2.c tokenizer (tokenizer.bin); a GGUF model carries its own tokenizer, so "
         "give it to -m without -z", path);
  // A SentencePiece .model (protobuf ModelProto: field 1 `pieces`, each a message whose field 1 is
  // the piece: bytes 0a LEN 0a) where tokenizer.bin's int32 max_token_length would have zero high bytes.
  if (file->bytes().size() >= 3 && file->bytes()[0] == 0x0a && file->bytes()[1] != 0 && file->bytes()[2] == 0x0a)
    fail("{}: this looks like a SentencePiece .model file (protobuf), not a llama2.c tokenizer (tokenizer.bin); "
         "llama2.c's tokenizer.py --export writes the .bin from it",
         path);
  ByteReader r(file->bytes(), path);
  const auto max_token_length = r.read<int32_t>("max_token_length");
  if (max_token_length < 0) fail("{}: negative max_token_length {}", path, max_token_length);

  SpmVocab vocab;
  vocab.pieces.reserve(n_vocab);
  vocab.scores.reserve(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (r.remaining() < 8)
      fail("{}: file ends at offset {} after {} of {} tokens (cut short, or n_vocab does not match)", path,
           r.offset(), i, n_vocab);
    const auto score = r.read<float>("score");
    const size_t len_offset = r.offset();
    const auto len = r.read<int32_t>("length");
    if (len < 0) fail("{}: token {} has negative length {} at offset {}", path, i, len, len_offset);
    if (static_cast<size_t>(len) > r.remaining())
      fail("{}: token {} length {} at offset {} runs past the end of the file ({} bytes)", path, i, len, len_offset,
           r.size());
    vocab.scores.push_back(score);
    vocab.pieces.emplace_back(r.read_bytes(static_cast<size_t>(len), "piece"));
  }
  if (r.remaining() != 0)
    fail("{}: {} bytes left after {} tokens at offset {}: the file holds more tokens than the model's n_vocab", path,
         r.remaining(), n_vocab, r.offset());
  vocab.bos_id = 1 < n_vocab ? 1 : -1;
  vocab.eos_id = 2 < n_vocab ? 2 : -1;
  vocab.unk_id = 0;
  // llama2.c's tokenizer.py writes BOS and EOS as "\n<s>\n" and "\n</s>\n" (for its own printing).
  // Their SentencePiece names, and token types as the GGUF of the same model has (unknown, control,
  // byte, normal), so that `<s>` / `</s>` in a prompt or a chat template's bos_token are the tokens,
  // as with the .gguf and llama.cpp (run.c matches no special text at all).
  const std::pair<int32_t, std::string_view> names[] = {{0, "<unk>"}, {1, "\n<s>\n"}, {2, "\n</s>\n"}};
  for (const auto& [id, written] : names)
    if (id < n_vocab && vocab.pieces[static_cast<size_t>(id)] == written)
      vocab.pieces[static_cast<size_t>(id)] = id == 0 ? "<unk>" : id == 1 ? "<s>" : "</s>";
  vocab.types.reserve(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i)
    vocab.types.push_back(i == 0 ? kTypeUnknown
                          : i <= 2 ? kTypeControl
                          : parse_byte_piece(vocab.pieces[static_cast<size_t>(i)]) >= 0 ? kTypeByte
                                                                                          : kTypeNormal);
  try {
    return make_spm_tokenizer(std::move(vocab));
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
}

namespace {

// GGUF vocab ("tokenizer.ggml.model" == "llama") from the metadata the GGUF loader stored.
std::unique_ptr<Tokenizer> load_gguf_spm_tokenizer(const ModelFile& model) {
  const std::string& path = model.path;
  auto array = [&](const char* key, bool required) -> const nlohmann::ordered_json* {
    if (!model.has(key)) {
      if (required) fail("{}: missing metadata key {}", path, key);
      return nullptr;
    }
    const auto& v = model.metadata.at(key);
    if (!v.is_array()) fail("{}: metadata key {} is not an array", path, key);
    return &v;
  };
  const auto& tokens = *array("tokenizer.ggml.tokens", true);
  const auto* scores = array("tokenizer.ggml.scores", false);
  const auto* types = array("tokenizer.ggml.token_type", false);
  const size_t n = tokens.size();
  if (scores && scores->size() != n)
    fail("{}: tokenizer.ggml.scores has {} entries, tokenizer.ggml.tokens {}", path, scores->size(), n);
  if (types && types->size() != n)
    fail("{}: tokenizer.ggml.token_type has {} entries, tokenizer.ggml.tokens {}", path, types->size(), n);

  SpmVocab vocab;
  const bool rstrips = gguf_vocab_rstrips_specials(model);
  vocab.pieces.reserve(n);
  vocab.scores.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!tokens[i].is_string()) fail("{}: tokenizer.ggml.tokens[{}] is not a string", path, i);
    vocab.pieces.push_back(tokens[i].get<std::string>());
    if (scores) {
      if (!(*scores)[i].is_number()) fail("{}: tokenizer.ggml.scores[{}] is not a number", path, i);
      vocab.scores.push_back((*scores)[i].get<float>());
    } else {
      vocab.scores.push_back(0.0f);  // without scores merges go leftmost first
    }
    if (types) {
      if (!(*types)[i].is_number_integer()) fail("{}: tokenizer.ggml.token_type[{}] is not an integer", path, i);
      // llama_token_type: 0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
      const int64_t type = (*types)[i].is_number_unsigned() && (*types)[i].get<uint64_t>() > INT64_MAX
                               ? -1
                               : (*types)[i].get<int64_t>();
      if (type < 0 || type > kTypeByte)
        fail("{}: tokenizer.ggml.token_type[{}] = {} is not a token type (0 to 6)", path, i, (*types)[i].dump());
      vocab.types.push_back(gguf_token_type_as_llama_cpp(vocab.pieces.back(), static_cast<int32_t>(type)));
      if (rstrips) vocab.rstrip.push_back(gguf_special_rstrips(rstrips, vocab.pieces.back()) ? 1 : 0);
    }
  }
  auto id = [&](const char* key, int64_t def) -> int32_t {
    const int64_t v = model.get_int(key, def);
    if (v < -1 || v >= static_cast<int64_t>(n)) fail("{}: {} = {} is outside the vocab [0, {})", path, key, v, n);
    return static_cast<int32_t>(v);
  };
  vocab.bos_id = id("tokenizer.ggml.bos_token_id", 1);
  vocab.eos_id = id("tokenizer.ggml.eos_token_id", 2);
  vocab.unk_id = id("tokenizer.ggml.unknown_token_id", 0);
  const int32_t eot_id = id("tokenizer.ggml.eot_token_id", -1);
  if (model.has("tokenizer.ggml.add_space_prefix")) {
    const auto& v = model.metadata.at("tokenizer.ggml.add_space_prefix");
    if (!v.is_boolean()) fail("{}: metadata key tokenizer.ggml.add_space_prefix is not a boolean", path);
    vocab.add_dummy_prefix = v.get<bool>();
  }
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = make_spm_tokenizer(std::move(vocab));
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
  if (eot_id >= 0 && eot_id != tokenizer->eos_id) tokenizer->extra_eos_ids.push_back(eot_id);
  // Pieces llama.cpp treats as end of generation by name (Gemma's <end_of_turn>, ...).
  for (int32_t i = 0; i < tokenizer->n_vocab(); ++i)
    if (is_end_of_generation_name(tokens[static_cast<size_t>(i)].get_ref<const std::string&>()) && !tokenizer->is_eos(i))
      tokenizer->extra_eos_ids.push_back(i);
  return tokenizer;
}

// tokenizer.ggml.add_bos_token / add_eos_token (llama.cpp's vocab add_bos / add_eos), for every
// GGUF vocab type.
void apply_gguf_special_flags(const ModelFile& model, Tokenizer& t) {
  auto flag = [&](const char* key, bool def) {
    if (!model.has(key)) return def;
    const auto& v = model.metadata.at(key);
    if (!v.is_boolean()) fail("{}: metadata key {} is not a boolean", model.path, key);
    return v.get<bool>();
  };
  t.add_bos = flag("tokenizer.ggml.add_bos_token", true);
  t.add_eos = flag("tokenizer.ggml.add_eos_token", false);
  if (model.has("tokenizer.ggml.add_bos_token") && t.add_bos && t.bos_id < 0)
    fail("{}: tokenizer.ggml.add_bos_token is true but the vocab has no BOS token", model.path);
  if (t.add_eos && t.eos_id < 0)
    fail("{}: tokenizer.ggml.add_eos_token is true but the vocab has no EOS token", model.path);
}

}  // namespace

std::unique_ptr<Tokenizer> load_model_tokenizer(const ModelFile& model) {
  if (model.format == "gguf") {
    if (!model.has("tokenizer.ggml.model"))
      fail("{}: no tokenizer in this GGUF file (tokenizer.ggml.model missing); pass one with -z", model.path);
    const std::string type = model.get_str("tokenizer.ggml.model");
    if (type == "gpt2") return load_gguf_bpe_tokenizer(model);
    if (type != "llama")
      fail("{}: tokenizer model \"{}\" is not supported (supported: \"llama\", SentencePiece BPE; \"gpt2\", "
           "byte-level BPE)", model.path, printable(type));
    std::unique_ptr<Tokenizer> t = load_gguf_spm_tokenizer(model);
    apply_gguf_special_flags(model, *t);
    return t;
  }
  if (model.format == "llama2c") fail("{}: no tokenizer in this model file; pass one with -z", model.path);
  if (model.format == "hf") return load_hf_tokenizer(model);
  fail("{}: unknown model format \"{}\"; cannot load its tokenizer", model.path, model.format);
}

}  // namespace mk
