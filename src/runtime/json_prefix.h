// Constrained decoding of JSON replies: OpenAI's response_format {"type": "json_object"} (any one
// JSON object) and {"type": "json_schema"} (an object of a JSON Schema, the subset below).
//
// JsonSchema compiles a schema (JSON Schema 2020-12 keywords): `type` (a name or a list),
// `properties` + `required` (members come in the schema's order, as OpenAI's structured outputs and
// llama.cpp's json-schema-to-grammar write them; a required one cannot be skipped; no other keys
// unless the object lists no properties), `additionalProperties` false (the default here) or, for an
// object without properties, true / {} / a schema of the values (a dict), `items`, `prefixItems` (tuples;
// also draft 7's `items` list with `additionalItems`), `minItems`, `maxItems`,
// `minLength` / `maxLength` (characters), `minimum` / `maximum` / `exclusiveMinimum` /
// `exclusiveMaximum` (numbers so bounded are written without an exponent and with at most
// kBoundedFraction fraction digits; the text's exact decimal value is in range, so its nearest double
// is too), `enum` / `const` of strings, numbers (written as nlohmann writes them), booleans and null,
// `anyOf` / `oneOf` whose branches start differently (e.g. pydantic's
// Optional: [X, {"type": "null"}]) or are objects tagged by their first property (a required const /
// enum string, distinct between branches: a discriminated union; the tag picks the branch) or begin
// with different keys (an untagged union of models with different fields; the first key picks the
// branch), `$ref` to "#", "#/$defs/..." or "#/definitions/..." (recursion
// allowed; a schema whose values could only be infinite is refused), `false` subschemas (a
// property that must be absent, `items: false` for an empty array), and annotations (title,
// description, default, examples; $schema, $id, $comment), `pattern` (runtime/string_pattern.h;
// such strings take no \u escapes) and the `format`s date, time, date-time, uuid, email, ipv4 as
// patterns (other formats are annotations, as JSON Schema's default).
// Any other keyword (pattern, multipleOf, uniqueItems, allOf, ...) is refused by name rather than ignored.
//
// JsonPrefix is a byte-level pushdown automaton over one JSON value of such a schema (the root must
// be an object): RFC 8259 syntax, strictly valid UTF-8 in strings (RFC 3629), no control
// characters, and the whitespace of llama.cpp's grammars/json.gbnf between tokens (none, one space,
// or a newline and at most 20 spaces or tabs: a model cannot stall in whitespace), numbers of at
// most 16 digits before the point (json.gbnf's bound), 32 after it and 2 in the exponent (every
// number parses as a finite double). Nesting deeper than kMaxDepth is refused, and a container,
// property or item is begun only when its value can still end within it (JsonSchemaNode::min_depth). Property names and enum strings must be written as nlohmann writes
// them (the same escapes).
//
// JsonTokenMask turns it into a token mask: a token may follow when all its bytes continue the
// prefix; tokens without bytes (control tokens) never do. The engine samples from the allowed
// tokens and ends the request when the value is complete.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/string_pattern.h"

namespace mk {

class Tokenizer;

// A number bound, exact: units of 10^-kBoundScale (|values| up to 10^34: 16 integral digits).
__extension__ typedef __int128 JsonUnits;

struct JsonSchemaNode {
  static constexpr int kBoundScale = 18;
  static constexpr JsonUnits kOne = 1000000000000000000;  // 1 in units: 10^kBoundScale
  enum Type : uint8_t { kObject = 1, kArray = 2, kString = 4, kNumber = 8, kInteger = 16, kBoolean = 32, kNull = 64, kAny = 127 };
  uint8_t types = kAny;
  bool any_members = true;  // an object of any keys and values (no `properties`)
  bool closed = false;      // additionalProperties: false written (JSON Schema's default lets other keys be)
  struct Prop {
    std::string key;  // the name as written between quotes (nlohmann's escapes)
    const JsonSchemaNode* node = nullptr;
    bool required = false;
  };
  std::vector<Prop> props;                // in order
  const JsonSchemaNode* items = nullptr;  // array items (after prefix_items); null: any value
  std::vector<const JsonSchemaNode*> prefix_items;  // the first items' schemas (a tuple), in order
  int64_t min_items = 0, max_items = INT64_MAX;
  // An object of any keys (any_members) whose values are of this schema (additionalProperties: a
  // schema, pydantic's Dict[str, X]); null: any value.
  const JsonSchemaNode* additional = nullptr;
  int64_t min_length = 0, max_length = INT64_MAX;  // of a string, in Unicode characters (code points)
  const StringPattern* pattern = nullptr;  // a string's `pattern` (or its `format`'s); null: any
  // Levels of containers the shallowest value of this schema opens (0: it allows a scalar); set by
  // JsonSchema::compile. A container is only opened, a property or item only begun, when its value
  // can still end within JsonPrefix::kMaxDepth (else a deep recursive schema leads the model to a
  // key whose value it cannot open).
  int32_t min_depth = 0;
  bool string_enum = false;               // a string is one of enum_strings
  std::vector<std::string> enum_strings;  // as written between quotes
  bool number_enum = false;               // a number is one of enum_numbers
  std::vector<std::string> enum_numbers;  // as nlohmann writes them (1, -2, 0.5, 1e-07)
  // minimum / maximum: a number's value is in [lo, hi] (exclusive bounds made inclusive: the next
  // writable value; an integer's are whole units); unbounded: beyond any 16-digit number.
  bool bounded = false;
  JsonUnits lo = 0, hi = 0;
  const JsonSchemaNode* item(int64_t i) const {
    return i < static_cast<int64_t>(prefix_items.size()) ? prefix_items[static_cast<size_t>(i)] : items;
  }
  bool allow_true = true, allow_false = true;  // with kBoolean
  // anyOf / oneOf: the branches (whose first bytes differ); a value takes the branch its first byte
  // starts. types / allow_* are the union's. (Branches are referred to, not copied: a recursive
  // schema's branch may still be compiling.)
  std::vector<const JsonSchemaNode*> branches;
  // A tagged union (anyOf / oneOf of objects whose first property, required, is the same key holding
  // distinct const / enum strings: a discriminated union, e.g. pydantic models tagged by a Literal):
  // this node is an object whose one property is that tag (props[0], the union of the strings);
  // once the tag's string is written, the object goes on as tagged[i], i its index in the tag's
  // enum_strings.
  std::vector<const JsonSchemaNode*> tagged;
  // A union of objects told apart by their first key (anyOf / oneOf of objects, untagged, whose
  // possible first keys -- their properties up to and with the first required one -- differ between
  // branches): this node is an object whose props are those keys (none required); once key i is
  // written, the object goes on as keyed[i], from its property keyed_prop[i].
  std::vector<const JsonSchemaNode*> keyed;
  std::vector<int32_t> keyed_prop;
  bool keyed_empty = false;  // some branch takes {} (none of its properties required)
};

class JsonSchema {
 public:
  static constexpr size_t kMaxChoices = 64;  // properties of an object, strings of an enum
  // Any one JSON object (json_object).
  static std::shared_ptr<const JsonSchema> any_object();
  // Compiles a schema; throws mk::Error naming what is not supported or malformed (with its JSON
  // pointer, e.g. "/properties/age: 'minimum' is not supported").
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::ordered_json& schema);
  const JsonSchemaNode* root() const { return root_; }

 private:
  std::deque<JsonSchemaNode> nodes_;  // stable addresses
  std::deque<StringPattern> patterns_;
  const JsonSchemaNode* root_ = nullptr;
  friend class JsonSchemaCompiler;
};

class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxIndent = 20;  // spaces / tabs after a newline
  static constexpr int kMaxDigits = 16;    // of a number's integral part (json.gbnf's bound)
  static constexpr int kMaxExponent = 2;   // digits of its exponent: every number is a finite double (< 1e115)
  static constexpr int kMaxFraction = 32;  // of its fraction (json.gbnf: any; 17 significant digits need ~22)
  static constexpr int kBoundedFraction = JsonSchemaNode::kBoundScale;  // of a bounded number's fraction
  // One JSON object of any shape (json_object).
  JsonPrefix();
  // One value of `schema` (kept alive by the caller).
  explicit JsonPrefix(const JsonSchema& schema);
  JsonPrefix(const JsonPrefix& o) { *this = o; }
  JsonPrefix& operator=(const JsonPrefix& o);  // copies only the open frames
  // Appends a byte; returns false (and leaves the state unchanged) when the text would no longer be
  // the start of a value of the schema.
  bool feed(uint8_t c);
  // Appends bytes; false (state unspecified) at the first that does not fit.
  bool feed(std::string_view bytes);
  // Whether the text is one whole value.
  bool complete() const { return s_ == S::done; }

 private:
  enum class S : uint8_t {
    start, value, obj_first, obj_key, colon, obj_next, arr_first, arr_next,
    str, str_esc, str_u, str_utf8, str_choice, str_lo_bs, str_lo_u,
    n_minus, n_zero, n_int, n_dot, n_frac, n_e, n_esign, n_exp, n_choice,
    lit, done
  };
  enum class Ws : uint8_t { none, space, newline };
  struct Frame {  // no initializers: a copy writes only the open frames (frames_[0, depth_))
    const JsonSchemaNode* node;
    int32_t next;  // object: the index of the property after the last one written; array: items written
    bool object;
  };
  bool step(uint8_t c);
  bool value(uint8_t c);  // the first byte of a value of node_
  bool whitespace(uint8_t c);
  void value_done();      // a value ended: the container's next state, or done
  bool structural() const;
  bool open_key();        // a '"' where a key may start: its choices
  bool may_close_object() const;
  bool may_add_member() const;
  bool fits(const JsonSchemaNode* v) const;  // a value of v begun now can end within kMaxDepth
  static int32_t object_depth(const JsonSchemaNode& n);  // levels a shallowest object of n opens
  static int32_t array_depth(const JsonSchemaNode& n);   // levels a shallowest array of n opens
  bool in_bounds(bool ending) const;  // a bounded number: some value it can still become (ending: it is) is in range
  // A string with a pattern: some character in [lo, hi] continues it (within its length bounds);
  // commit: the character is whole, take it.
  bool pattern_char(uint32_t lo, uint32_t hi, bool commit);
  bool patterned() const { return !key_ && node_->pattern; }  // the string being read has a pattern
  bool pattern_utf8();  // after a byte of a UTF-8 character: the characters its bytes so far can become

  S s_ = S::start;
  Ws ws_ = Ws::none;
  uint8_t indent_ = 0;             // spaces / tabs after the newline
  bool key_ = false;               // the string being read is an object key
  bool integer_ = false;           // the number being read must be an integer
  uint8_t left_ = 0;               // hex digits of \uXXXX, or UTF-8 continuation bytes, still due
  uint8_t lo_ = 0x80, hi_ = 0xBF;  // the range of the next UTF-8 continuation byte
  const char* lit_ = nullptr;      // the rest of true / false / null
  uint16_t off_ = 0;               // bytes of a choice string read
  uint8_t digits_ = 0;             // digits of the number part being read
  bool neg_ = false;               // a bounded number: its sign, integral part and fraction digits so far
  uint64_t int_ = 0, frac_ = 0;
  uint32_t cp_ = 0;                // a UTF-8 character's bits so far (strings with a pattern)
  StringPattern::Set re_{};        // the pattern's state
  uint16_t code_ = 0;              // the \uXXXX being read
  int64_t chars_ = 0;              // characters of the string value being read (minLength / maxLength)
  bool low_ = false;               // it must be a low surrogate (after a high one)
  uint64_t choices_ = 0;           // str_choice: the candidates (bits of props from choice_base_, or enum strings)
  int32_t choice_base_ = 0;        // key choices: the property index of bit 0
  int32_t prop_ = -1;              // the property whose value comes next (after a key)
  const JsonSchemaNode* node_ = nullptr;  // the schema of the value being read (or about to be)
  int depth_ = 0;
  std::array<Frame, kMaxDepth> frames_;  // [0, depth_) are the open containers
};

using JsonObjectPrefix = JsonPrefix;

// The mask over a vocabulary: `token_bytes[id]` the bytes token id adds to the text.
// Tokens are walked in byte order, so a run of tokens sharing a prefix feeds that prefix once and
// a byte that does not fit skips every token that starts with it (an implicit trie: about 256
// feeds between a JSON structure's tokens, one per trie node inside a string).
class JsonTokenMask {
 public:
  explicit JsonTokenMask(std::vector<std::string> token_bytes);
  // The mask of a model's vocabulary (n_vocab ids): each token's bytes after an ordinary token (only a
  // token right after BOS would differ: SentencePiece drops its leading space).
  static std::unique_ptr<JsonTokenMask> of(const Tokenizer& tokenizer, int64_t n_vocab);
  // allowed[id] = 1 when token id's bytes continue `prefix` (allowed is resized to the vocabulary);
  // returns how many are.
  int64_t allowed(const JsonPrefix& prefix, std::vector<uint8_t>& allowed) const;
  // The same, token by token (the reference for tests).
  int64_t allowed_each(const JsonPrefix& prefix, std::vector<uint8_t>& allowed) const;
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  int64_t n_vocab() const { return static_cast<int64_t>(bytes_.size()); }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> order_;  // ids of tokens with bytes, by bytes
  std::vector<uint32_t> lcp_;   // lcp_[i]: bytes order_[i] shares with order_[i - 1] (0 for i = 0)
  size_t max_len_ = 0;
};

}  // namespace mk
