// Constrained decoding of one JSON object (OpenAI's response_format {"type": "json_object"}).
//
// JsonObjectPrefix is a byte-level pushdown automaton that accepts exactly the prefixes of one JSON
// object (RFC 8259: objects, arrays, strings with escapes and strictly valid UTF-8 (RFC 3629), no
// control characters, numbers, true/false/null), with the whitespace of llama.cpp's
// grammars/json.gbnf between tokens: none, one space, or a newline and at most 20 spaces or tabs (a
// model cannot stall in whitespace). Nesting deeper than kMaxDepth is refused.
//
// JsonTokenMask turns it into a token mask: a token may follow when all its bytes continue the
// prefix; tokens without bytes (control tokens) never do. The engine samples from the allowed
// tokens and ends the request when the object is complete.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mk {

class JsonObjectPrefix {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxIndent = 20;  // spaces / tabs after a newline
  // Appends a byte; returns false (and leaves the state unchanged) when the text would no longer be
  // the start of one JSON object.
  bool feed(uint8_t c);
  // Appends bytes; false (state unspecified) at the first that does not fit.
  bool feed(std::string_view bytes);
  // Whether the text is one whole JSON object.
  bool complete() const { return s_ == S::done; }

 private:
  enum class S : uint8_t {
    start, value, obj_first, obj_key, colon, obj_next, arr_first, arr_next,
    str, str_esc, str_u, str_utf8,
    n_minus, n_zero, n_int, n_dot, n_frac, n_e, n_esign, n_exp,
    lit, done
  };
  enum class Ws : uint8_t { none, space, newline };
  bool step(uint8_t c);
  bool value(uint8_t c);   // the first byte of a value
  bool whitespace(uint8_t c);
  void value_done();       // a value ended: the container's next state, or done
  bool structural() const;

  S s_ = S::start;
  Ws ws_ = Ws::none;
  uint8_t indent_ = 0;             // spaces / tabs after the newline
  bool key_ = false;               // the string being read is an object key
  uint8_t left_ = 0;               // hex digits of \uXXXX, or UTF-8 continuation bytes, still due
  uint8_t lo_ = 0x80, hi_ = 0xBF;  // the range of the next UTF-8 continuation byte
  const char* lit_ = nullptr;      // the rest of true / false / null
  uint8_t depth_ = 0;
  uint64_t objects_ = 0;           // bit i: level i is an object (else an array)
};

// The mask over a vocabulary: `token_bytes[id]` the bytes token id adds to the text.
class JsonTokenMask {
 public:
  explicit JsonTokenMask(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {}
  // allowed[id] = 1 when token id's bytes continue `prefix` (allowed is resized to the vocabulary);
  // returns how many are.
  int64_t allowed(const JsonObjectPrefix& prefix, std::vector<uint8_t>& allowed) const;
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  int64_t n_vocab() const { return static_cast<int64_t>(bytes_.size()); }

 private:
  std::vector<std::string> bytes_;
};

}  // namespace mk
