#include "runtime/json_prefix.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>

#include "model/tokenizer.h"
#include "support/error.h"

namespace mk {

namespace {
using J = nlohmann::ordered_json;

bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

const JsonSchemaNode kAnyNode{};  // any value; objects of any members

// A string as written between quotes.
std::string quoted_body(const std::string& s) {
  const std::string d = J(s).dump();
  return d.substr(1, d.size() - 2);
}

std::string pointer_token(const std::string& key) {
  std::string r;
  for (char c : key) {
    if (c == '~') r += "~0";
    else if (c == '/') r += "~1";
    else r += c;
  }
  return r;
}

// The first bytes a node's values can start with, as classes: { [ " digit t f n.
enum Starts : uint8_t { kSObj = 1, kSArr = 2, kSStr = 4, kSNum = 8, kSTrue = 16, kSFalse = 32, kSNull = 64 };
uint8_t starts(const JsonSchemaNode& n) {
  uint8_t s = 0;
  if (n.types & JsonSchemaNode::kObject) s |= kSObj;
  if (n.types & JsonSchemaNode::kArray) s |= kSArr;
  if (n.types & JsonSchemaNode::kString) s |= kSStr;
  if (n.types & (JsonSchemaNode::kNumber | JsonSchemaNode::kInteger)) s |= kSNum;
  if ((n.types & JsonSchemaNode::kBoolean) && n.allow_true) s |= kSTrue;
  if ((n.types & JsonSchemaNode::kBoolean) && n.allow_false) s |= kSFalse;
  if (n.types & JsonSchemaNode::kNull) s |= kSNull;
  return s;
}
}  // namespace

class JsonSchemaCompiler {
 public:
  JsonSchemaCompiler(const J& root, JsonSchema& out) : root_(root), out_(out) {}

  const JsonSchemaNode* node_at(const std::string& ptr) {
    if (auto it = memo_.find(ptr); it != memo_.end()) return it->second;
    // A client's schema: its nesting through properties, items, branches and $refs, and its size,
    // are bounded (a chain of 30000 $refs in a 1 MB body would otherwise recurse that deep).
    struct Depth {
      int& d;
      explicit Depth(int& x) : d(++x) {}
      ~Depth() { --d; }
    } depth(depth_);
    if (depth_ > kMaxNesting) bad(ptr, fmt::format("schemas nested (through properties, items, branches and $refs) deeper than {} are not supported", kMaxNesting));
    if (out_.nodes_.size() >= kMaxNodes) bad(ptr, fmt::format("schemas of more than {} subschemas are not supported", kMaxNodes));
    const J& s = at(ptr, ptr);
    if (s.is_object() && s.contains("$ref")) {  // a reference: the node of its target
      for (const auto& [k, v] : s.items())
        if (k != "$ref" && !annotation(k) && k != "$defs" && k != "definitions")
          bad(ptr, fmt::format("'{}' beside '$ref' is not supported", k));
      if (!s["$ref"].is_string()) bad(ptr, "'$ref' must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      if (ref.empty() || ref[0] != '#') bad(ptr, fmt::format("'$ref' \"{}\": only references inside the schema (\"#...\") are supported", ref));
      std::string target;  // the fragment, percent-decoded (RFC 3986), is a JSON pointer
      for (size_t i = 1; i < ref.size(); ++i) {
        if (ref[i] == '%' && i + 2 < ref.size() && is_hex(static_cast<uint8_t>(ref[i + 1])) && is_hex(static_cast<uint8_t>(ref[i + 2]))) {
          target += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
          i += 2;
        } else {
          target += ref[i];
        }
      }
      if (!resolving_.insert(ptr).second) bad(ptr, "a cycle of '$ref's that never reaches a schema");
      const JsonSchemaNode* n = node_at(target);
      resolving_.erase(ptr);
      memo_[ptr] = n;
      return n;
    }
    JsonSchemaNode* n = &out_.nodes_.emplace_back();
    memo_[ptr] = n;  // before its members: a recursive schema refers back to it
    fill(*n, s, ptr);
    return n;
  }

 private:
  [[noreturn]] static void bad(const std::string& ptr, const std::string& why) {
    fail("json_schema {}: {}", ptr.empty() ? "(the root)" : ptr, why);
  }
  static bool annotation(const std::string& k) {
    // ("discriminator": OpenAPI's, which pydantic writes beside a tagged oneOf: the tags say the same)
    static const std::set<std::string> keys = {"title", "description", "default", "examples", "format", "discriminator",
                                               "$schema", "$id", "$comment", "readOnly", "writeOnly", "deprecated"};
    return keys.count(k) != 0;
  }
  const J& at(const std::string& ptr, const std::string& where) {
    try {
      return root_.at(J::json_pointer(ptr));
    } catch (const J::exception&) {
      bad(where, fmt::format("'{}' names nothing in the schema", ptr.empty() ? "#" : "#" + ptr));
    }
  }

  // Makes `n` a tagged union of the object branches `objs` (JsonSchemaNode::tagged): objects whose
  // first property is one key holding strings of an enum / const, no string in two branches. The
  // tag is written first and is required here even where a branch lets it out (pydantic gives a
  // Literal tag with a default no place in `required`): an instance with it is still valid. Returns
  // why not ("" when it is one). A branch still compiling (recursion) has no properties yet.
  std::string tag_union(JsonSchemaNode& n, const std::vector<const JsonSchemaNode*>& objs, const std::vector<size_t>& index) {
    const std::string* key = nullptr;
    std::vector<std::string> values;
    std::vector<const JsonSchemaNode*> owner;
    for (size_t i = 0; i < objs.size(); ++i) {
      const JsonSchemaNode* b = objs[i];
      if (!b->tagged.empty() || !b->keyed.empty() || provisional_.count(b))
        return fmt::format("branch {} is itself a union of objects (not supported)", index[i]);
      if (b->types != JsonSchemaNode::kObject || !b->branches.empty() || b->any_members || b->props.empty())
        return fmt::format("branch {} is not an object with properties", index[i]);
      const JsonSchemaNode::Prop& tag = b->props[0];
      if (!tag.node->string_enum || tag.node->types != JsonSchemaNode::kString)
        return fmt::format("branch {}'s first property \"{}\" is not a const / enum string", index[i], tag.key);
      if (key && *key != tag.key)
        return fmt::format("branch {}'s first property is \"{}\", another's \"{}\"", index[i], tag.key, *key);
      key = &tag.key;
      for (const std::string& v : tag.node->enum_strings) {
        if (std::find(values.begin(), values.end(), v) != values.end())
          return fmt::format("the tag \"{}\" names two branches", v);
        values.push_back(v);
        owner.push_back(b);
      }
    }
    if (values.size() > JsonSchema::kMaxChoices)
      return fmt::format("{} tags, more than {}", values.size(), JsonSchema::kMaxChoices);
    JsonSchemaNode& t = out_.nodes_.emplace_back();
    t.types = JsonSchemaNode::kString;
    t.string_enum = true;
    t.enum_strings = std::move(values);
    n.types = JsonSchemaNode::kObject;
    n.any_members = false;
    n.allow_true = n.allow_false = false;
    n.props = {JsonSchemaNode::Prop{*key, &t, true}};
    n.tagged = std::move(owner);
    n.branches.clear();
    return "";
  }

  // anyOf / oneOf object branches (2 or more), made one object branch: a tagged union, else one told
  // apart by its first keys; oneOf's branches must also exclude each other.
  struct Union {
    JsonSchemaNode* node;
    std::vector<const JsonSchemaNode*> objs;
    std::vector<size_t> index;
    std::string ptr;
    const char* key;
  };
  void make_union(const Union& un) {
    const std::string why = tag_union(*un.node, un.objs, un.index);
    if (why.empty()) return;
    const std::string why_keys = key_union(*un.node, un.objs, un.index);
    if (!why_keys.empty())
      bad(un.ptr, fmt::format("'{}' object branches must be a tagged union (their first property the same key, each "
                              "holding different const / enum strings: {}) or begin with different keys (their "
                              "properties up to the first required one: {})",
                              un.key, why, why_keys));
    if (std::string_view(un.key) != "oneOf") return;
    // oneOf: an object of one branch must be of no other. JSON Schema lets an object hold keys its
    // schema does not list (unless additionalProperties is false), so another branch refuses it only
    // by a required key the first branch does not list, or, closed, by a key of the first branch's
    // it does not list (trial 50: oneOf [{x}, {y}] replies matched both).
    const auto lists = [](const JsonSchemaNode* b, const std::string& k) {
      return std::any_of(b->props.begin(), b->props.end(), [&](const JsonSchemaNode::Prop& p) { return p.key == k; });
    };
    for (size_t a = 0; a < un.objs.size(); ++a)
      for (size_t b = 0; b < un.objs.size(); ++b) {
        if (a == b) continue;
        const JsonSchemaNode *A = un.objs[a], *B = un.objs[b];
        bool excluded = std::any_of(B->props.begin(), B->props.end(), [&](const JsonSchemaNode::Prop& p) { return p.required && !lists(A, p.key); });
        if (!excluded && B->closed) {  // every first key of A's is one B does not list, and A writes one
          bool a_requires = false, firsts_unlisted = true;
          for (size_t k = 0; k < A->props.size() && !a_requires; ++k) {
            a_requires = A->props[k].required;
            firsts_unlisted &= !lists(B, A->props[k].key);
          }
          excluded = a_requires && firsts_unlisted;
        }
        if (!excluded)
          bad(un.ptr, fmt::format("'oneOf' branches {} and {}: an object of branch {} may also be one of branch {} (JSON Schema "
                                  "lets an object hold keys its schema does not list); use 'anyOf', or make each branch "
                                  "require a key the others do not list",
                                  un.index[a], un.index[b], un.index[a], un.index[b]));
      }
  }

 public:
  // The unions put off while their branches compiled (make_union), in order.
  void make_deferred() {
    for (size_t i = 0; i < deferred_.size(); ++i) {
      provisional_.erase(deferred_[i].node);
      make_union(deferred_[i]);
    }
  }

 private:
  // Makes `n` a union of the object branches `objs` told apart by their first key
  // (JsonSchemaNode::keyed): each branch's possible first keys (its properties up to and with the
  // first required one) belong to no other branch. Returns why not ("" when it is one).
  std::string key_union(JsonSchemaNode& n, const std::vector<const JsonSchemaNode*>& objs, const std::vector<size_t>& index) {
    std::vector<JsonSchemaNode::Prop> keys;
    std::vector<const JsonSchemaNode*> owner;
    std::vector<int32_t> prop;
    std::vector<size_t> from;
    bool empty_ok = false;
    for (size_t i = 0; i < objs.size(); ++i) {
      const JsonSchemaNode* b = objs[i];
      if (filling_.count(b)) return fmt::format("branch {} refers back to the union (recursion)", index[i]);
      if (!b->tagged.empty() || !b->keyed.empty() || provisional_.count(b))
        return fmt::format("branch {} is itself a union of objects (not supported)", index[i]);
      if (b->types != JsonSchemaNode::kObject || !b->branches.empty() || b->any_members)
        return fmt::format("branch {} is not an object with properties", index[i]);
      bool required = false;
      for (size_t k = 0; k < b->props.size() && !required; ++k) {
        required = b->props[k].required;
        for (size_t j = 0; j < keys.size(); ++j)
          if (keys[j].key == b->props[k].key)
            return fmt::format("branches {} and {} can both begin with \"{}\"", index[from[j]], index[i], b->props[k].key);
        keys.push_back({b->props[k].key, b->props[k].node, false});
        owner.push_back(b);
        prop.push_back(static_cast<int32_t>(k));
        from.push_back(i);
      }
      empty_ok |= !required;
    }
    if (keys.size() > JsonSchema::kMaxChoices) return fmt::format("{} first keys, more than {}", keys.size(), JsonSchema::kMaxChoices);
    n.types = JsonSchemaNode::kObject;
    n.any_members = false;
    n.allow_true = n.allow_false = false;
    n.props = std::move(keys);
    n.keyed = std::move(owner);
    n.keyed_prop = std::move(prop);
    n.keyed_empty = empty_ok;
    n.branches.clear();
    return "";
  }

  // A JSON number in units of 10^-kBoundScale, rounded up (`up`) or down where it has more digits;
  // beyond what a number of JsonPrefix::kMaxDigits integral digits can reach it is +-kHuge.
  static constexpr JsonUnits kHuge = 100000000000000000 * JsonSchemaNode::kOne;  // 10^35
  static JsonUnits units(const J& v, bool up) {
    const std::string t = v.dump();  // the shortest text that reads back as v (nlohmann: 0.3, 1e-07, 2.5e+20)
    size_t i = 0;
    const bool neg = t[0] == '-';
    if (neg) ++i;
    std::string digits;
    int exp = 0;  // value = digits * 10^exp
    for (; i < t.size() && t[i] != 'e' && t[i] != 'E'; ++i) {
      if (t[i] == '.') {
        for (++i; i < t.size() && is_digit(static_cast<uint8_t>(t[i])); ++i, --exp) digits += t[i];
        break;
      }
      digits += t[i];
    }
    if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) exp += std::stoi(t.substr(i + 1));
    digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
    if (digits.empty()) return 0;
    exp += JsonSchemaNode::kBoundScale;
    if (static_cast<int>(digits.size()) + exp > 35) return neg ? -kHuge : kHuge;
    JsonUnits m = 0;
    bool rest = false;  // digits dropped below one unit
    for (size_t k = 0; k < digits.size(); ++k) {
      if (static_cast<int>(k) >= static_cast<int>(digits.size()) + exp) {
        rest |= digits[k] != '0';
        continue;
      }
      m = m * 10 + (digits[k] - '0');
    }
    for (int k = 0; k < exp; ++k) m *= 10;
    if (rest && up != neg) m += 1;  // away from zero when rounding that way
    return neg ? -m : m;
  }

  // minimum / maximum / exclusiveMinimum / exclusiveMaximum (2020-12: numbers; draft 4: booleans
  // beside minimum / maximum) as an inclusive range of units.
  void bounds(JsonSchemaNode& n, const J& s, const std::string& ptr) {
    JsonUnits lo = -kHuge, hi = kHuge;
    bool any = false;
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(k)) continue;
      const J& v = s[k];
      const bool min = std::string_view(k).find("inimum") != std::string_view::npos;
      const bool exclusive = k[0] == 'e';
      if (exclusive && v.is_boolean()) {  // draft 4: makes minimum / maximum exclusive
        if (!s.contains(min ? "minimum" : "maximum")) bad(ptr, fmt::format("'{}' {} without '{}'", k, v.dump(), min ? "minimum" : "maximum"));
        continue;
      }
      if (!v.is_number()) bad(ptr, fmt::format("'{}' must be a number", k));
      const bool excl = exclusive || (s.contains(min ? "exclusiveMinimum" : "exclusiveMaximum") &&
                                      s[min ? "exclusiveMinimum" : "exclusiveMaximum"].is_boolean() &&
                                      s[min ? "exclusiveMinimum" : "exclusiveMaximum"].get<bool>());
      // The least / greatest decimal whose double a client reads is in range: at least / most the
      // bound's shortest text (a decimal past it reads as a double past it, rounding being monotone);
      // for an exclusive bound, the shortest text of the next double beyond it (a decimal just past
      // the bound itself may read back as the bound).
      const J b = excl ? J(std::nextafter(v.get<double>(), min ? HUGE_VAL : -HUGE_VAL)) : v;
      if (min) lo = std::max(lo, units(b, true));
      else hi = std::min(hi, units(b, false));
      any = true;
    }
    if (!any) return;
    if (!(n.types & (JsonSchemaNode::kNumber | JsonSchemaNode::kInteger))) return;  // bounds apply to numbers only
    if (!(n.types & JsonSchemaNode::kNumber)) {  // an integer: whole units
      constexpr JsonUnits one = JsonSchemaNode::kOne;
      auto floor_div = [](JsonUnits a, JsonUnits b) { return a / b - (a % b != 0 && a < 0 ? 1 : 0); };
      lo = -floor_div(-lo, one) * one;
      hi = floor_div(hi, one) * one;
    }
    // the values of JsonPrefix::kMaxDigits integral digits (and kBoundedFraction fraction digits)
    constexpr JsonUnits one = JsonSchemaNode::kOne;
    const JsonUnits top = (n.types & JsonSchemaNode::kNumber) ? 10000000000000000 * one - 1 : 9999999999999999 * one;
    lo = std::max(lo, -top);
    hi = std::min(hi, top);
    if (lo > hi)
      bad(ptr, fmt::format("'minimum' / 'maximum' allow no number of at most {} digits before the point and {} after it",
                           JsonPrefix::kMaxDigits, JsonPrefix::kBoundedFraction));
    n.bounded = true;
    n.lo = lo;
    n.hi = hi;
  }

  void fill(JsonSchemaNode& n, const J& s, const std::string& ptr) {
    filling_.insert(&n);
    fill_node(n, s, ptr);
    filling_.erase(&n);
  }

  void fill_node(JsonSchemaNode& n, const J& s, const std::string& ptr) {
    std::vector<std::string> enum_raw;  // a string enum's values, decoded
    if (s.is_boolean()) {
      if (!s.get<bool>()) bad(ptr, "the schema false allows no value");
      return;  // true: any value
    }
    if (!s.is_object()) bad(ptr, "a schema must be an object or a boolean");
    static const std::set<std::string> known = {
        "type",     "properties", "required", "additionalProperties", "items",   "prefixItems", "additionalItems",  "minItems",
        "maxItems", "uniqueItems", "minLength", "maxLength",          "minimum", "maximum",     "exclusiveMinimum", "exclusiveMaximum",
        "enum",     "const",      "anyOf",    "oneOf",                "$defs",   "definitions", "pattern"};
    for (const auto& [k, v] : s.items())
      if (!known.count(k) && !annotation(k)) bad(ptr, fmt::format("'{}' is not supported", k));
    // uniqueItems: true would need every item remembered (a set's); false is the default
    if (s.contains("uniqueItems") && !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>()))
      bad(ptr, "'uniqueItems' is not supported");
    if (s.contains("anyOf") || s.contains("oneOf")) {
      for (const auto& [k, v] : s.items())
        if (k != "anyOf" && k != "oneOf" && k != "$defs" && k != "definitions" && k != "uniqueItems" && known.count(k))
          bad(ptr, fmt::format("'{}' beside 'anyOf' / 'oneOf' is not supported", k));
      if (s.contains("anyOf") && s.contains("oneOf")) bad(ptr, "'anyOf' and 'oneOf' together are not supported");
      const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
      const J& branches = s[key];
      if (!branches.is_array() || branches.empty()) bad(ptr, fmt::format("'{}' must be a non-empty array", key));
      n.types = 0;
      n.allow_true = n.allow_false = false;
      // Branches are told apart by their first byte; several object branches may share '{' when
      // they are a tagged union (tag_union), which then stands for them as one branch.
      uint8_t seen = 0;
      std::optional<size_t> alike;  // a branch that can begin as another
      std::vector<const JsonSchemaNode*> objs;
      std::vector<size_t> obj_index;
      for (size_t i = 0; i < branches.size(); ++i) {
        const std::string bptr = fmt::format("{}/{}/{}", ptr, key, i);
        if (branches[i].is_boolean() && !branches[i].get<bool>()) continue;  // a branch nothing satisfies
        const JsonSchemaNode& b = *node_at(bptr);
        // (a branch still compiling -- recursion -- has its types already: they are set first)
        const uint8_t st = starts(b);
        n.types |= b.types;
        n.allow_true |= (b.types & JsonSchemaNode::kBoolean) && b.allow_true;
        n.allow_false |= (b.types & JsonSchemaNode::kBoolean) && b.allow_false;
        if (st == kSObj) {
          objs.push_back(&b);
          obj_index.push_back(i);
          continue;
        }
        if ((st & seen) && !alike) alike = i;
        if ((st & kSObj) && !objs.empty() && !alike) alike = i;
        seen |= st;
        n.branches.push_back(&b);
      }
      if (n.branches.empty() && objs.empty()) bad(ptr, "the schema allows no value");
      if ((seen & kSObj) && !objs.empty() && !alike) alike = obj_index.back();  // an object branch after it
      if (alike)
        bad(ptr, fmt::format("'{}' branches whose values can begin alike are not supported (branch {})", key, *alike));
      if (objs.size() == 1) {
        n.branches.push_back(objs[0]);
      } else if (objs.size() > 1) {
        const bool only_objects = n.branches.empty();
        JsonSchemaNode& u = only_objects ? n : out_.nodes_.emplace_back();
        if (!only_objects) n.branches.push_back(&u);
        Union un{&u, objs, obj_index, ptr, key};
        // A branch still compiling (the union is reached again through it: pydantic's
        // Union[Node, Leaf] with Node's children of the same union) has not all its properties yet:
        // the union is made once the whole schema is compiled; meanwhile it is an object.
        if (std::any_of(objs.begin(), objs.end(), [&](const JsonSchemaNode* b) { return filling_.count(b) != 0; })) {
          u.types = JsonSchemaNode::kObject;
          u.any_members = false;
          u.allow_true = u.allow_false = false;
          provisional_.insert(&u);
          deferred_.push_back(std::move(un));
        } else {
          make_union(un);
        }
      }
      return;
    }
    // type
    uint8_t types = JsonSchemaNode::kAny;
    if (s.contains("type")) {
      auto one = [&](const J& t) -> uint8_t {
        static const std::map<std::string, uint8_t> names = {
            {"object", JsonSchemaNode::kObject}, {"array", JsonSchemaNode::kArray},     {"string", JsonSchemaNode::kString},
            {"number", JsonSchemaNode::kNumber}, {"integer", JsonSchemaNode::kInteger}, {"boolean", JsonSchemaNode::kBoolean},
            {"null", JsonSchemaNode::kNull}};
        if (!t.is_string() || !names.count(t.get<std::string>())) bad(ptr, fmt::format("'type' {} is not a JSON Schema type", t.dump()));
        return names.at(t.get<std::string>());
      };
      const J& t = s["type"];
      types = 0;
      if (t.is_array()) {
        for (const J& x : t) types |= one(x);
        if (t.empty()) bad(ptr, "'type' is an empty list");
      } else {
        types = one(t);
      }
      if ((types & JsonSchemaNode::kNumber) && (types & JsonSchemaNode::kInteger)) types &= ~JsonSchemaNode::kInteger;
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      types = JsonSchemaNode::kObject;
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      types = JsonSchemaNode::kArray;
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) {
      types = JsonSchemaNode::kNumber;
    }
    n.types = types;
    bounds(n, s, ptr);
    // enum / const: strings, numbers, booleans, null
    if (s.contains("enum") || s.contains("const")) {
      if (s.contains("enum") && s.contains("const")) bad(ptr, "'enum' and 'const' together are not supported");
      J values = s.contains("const") ? J::array({s["const"]}) : s["enum"];
      if (!values.is_array() || values.empty()) bad(ptr, "'enum' must be a non-empty array");
      uint8_t allowed = 0;
      n.string_enum = true;
      n.allow_true = n.allow_false = false;
      for (const J& v : values) {
        if (v.is_string()) {
          allowed |= JsonSchemaNode::kString;
          n.enum_strings.push_back(quoted_body(v.get<std::string>()));
          enum_raw.push_back(v.get<std::string>());
          if (n.enum_strings.back().size() > 1024) bad(ptr, "an enum string longer than 1024 bytes is not supported");
        } else if (v.is_number()) {
          // a value of the node's type and bounds (1.0 is an integer, as JSON Schema counts)
          const bool whole = v.is_number_integer() || std::trunc(v.get<double>()) == v.get<double>();
          if (!(n.types & JsonSchemaNode::kNumber) && !((n.types & JsonSchemaNode::kInteger) && whole)) continue;
          if (n.bounded) {
            const JsonUnits u = units(v, false);
            if (u < n.lo || u > n.hi || u != units(v, true)) continue;
          }
          allowed |= JsonSchemaNode::kNumber | JsonSchemaNode::kInteger;
          n.number_enum = true;
          // an integer's whole float (1.0) written as an integer
          const bool as_int = !v.is_number_integer() && !(n.types & JsonSchemaNode::kNumber) && std::abs(v.get<double>()) < 1e15;
          n.enum_numbers.push_back(as_int ? J(static_cast<int64_t>(v.get<double>())).dump() : v.dump());
          if (std::find(n.enum_numbers.begin(), n.enum_numbers.end() - 1, n.enum_numbers.back()) != n.enum_numbers.end() - 1)
            n.enum_numbers.pop_back();
        } else if (v.is_boolean()) {
          allowed |= JsonSchemaNode::kBoolean;
          (v.get<bool>() ? n.allow_true : n.allow_false) = true;
        } else if (v.is_null()) {
          allowed |= JsonSchemaNode::kNull;
        } else {
          bad(ptr, fmt::format("'enum' / 'const' value {} is not supported (strings, numbers, true, false and null are)", v.dump()));
        }
      }
      if (n.enum_strings.size() > JsonSchema::kMaxChoices)
        bad(ptr, fmt::format("'enum' of more than {} strings is not supported", JsonSchema::kMaxChoices));
      if (n.enum_numbers.size() > JsonSchema::kMaxChoices)
        bad(ptr, fmt::format("'enum' of more than {} numbers is not supported", JsonSchema::kMaxChoices));
      n.types &= allowed;
    }
    // object
    if (s.contains("properties")) {
      const J& props = s["properties"];
      if (!props.is_object()) bad(ptr, "'properties' must be an object");
      if (props.size() > JsonSchema::kMaxChoices)
        bad(ptr, fmt::format("more than {} properties are not supported", JsonSchema::kMaxChoices));
      n.any_members = false;
      for (const auto& [k, v] : props.items()) {
        if (v.is_boolean() && !v.get<bool>()) {  // the property must be absent
          if (s.contains("required") && s["required"].is_array() && std::find(s["required"].begin(), s["required"].end(), J(k)) != s["required"].end())
            bad(ptr, fmt::format("property \"{}\" is required but its schema is false", k));
          continue;
        }
        JsonSchemaNode::Prop p;
        p.key = quoted_body(k);
        if (p.key.size() > 1024) bad(ptr, "a property name longer than 1024 bytes is not supported");
        p.node = node_at(ptr + "/properties/" + pointer_token(k));
        n.props.push_back(std::move(p));
      }
    }
    if (s.contains("required")) {
      const J& req = s["required"];
      if (!req.is_array()) bad(ptr, "'required' must be an array of property names");
      for (const J& r : req) {
        auto it = r.is_string() ? std::find_if(n.props.begin(), n.props.end(),
                                               [&](const JsonSchemaNode::Prop& p) { return p.key == quoted_body(r.get<std::string>()); })
                                : n.props.end();
        if (it == n.props.end()) bad(ptr, fmt::format("'required' names {}, which 'properties' does not list", r.dump()));
        it->required = true;
      }
    }
    if (s.contains("additionalProperties")) {
      const J& ap = s["additionalProperties"];
      const bool open = (ap.is_boolean() && ap.get<bool>()) || (ap.is_object() && ap.empty());
      const bool schema = ap.is_object() && !ap.empty();
      if (!open && !schema && !(ap.is_boolean() && !ap.get<bool>()))
        bad(ptr, "'additionalProperties' must be true, false or a schema");
      if ((open || schema) && !n.any_members) bad(ptr, "'additionalProperties' beside 'properties' is not supported");
      if (schema) n.additional = node_at(ptr + "/additionalProperties");  // a dict: any keys, values of it
      if (!open && !schema && n.props.empty()) n.any_members = false;  // {} only
      n.closed = !open && !schema;
    }
    // array: prefixItems (2020-12) or an items list (draft 7) for the first items, then items (2020-12)
    // or additionalItems (draft 7) for the rest
    const bool items_list = s.contains("items") && s["items"].is_array();
    if (s.contains("prefixItems") && items_list) bad(ptr, "'prefixItems' beside an 'items' list is not supported");
    if (s.contains("additionalItems") && !items_list) bad(ptr, "'additionalItems' without an 'items' list is not supported");
    if (s.contains("prefixItems") || items_list) {
      const char* key = items_list ? "items" : "prefixItems";
      const J& list = s[key];
      if (!list.is_array()) bad(ptr, fmt::format("'{}' must be an array of schemas", key));
      if (list.size() > JsonSchema::kMaxChoices)
        bad(ptr, fmt::format("'{}' of more than {} schemas is not supported", key, JsonSchema::kMaxChoices));
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].is_boolean() && !list[i].get<bool>()) {  // no item there: the array ends before it
          n.max_items = static_cast<int64_t>(i);
          break;
        }
        n.prefix_items.push_back(node_at(fmt::format("{}/{}/{}", ptr, key, i)));
      }
    }
    if (const char* rest = items_list ? "additionalItems" : "items"; s.contains(rest)) {
      const J& it = s[rest];
      if (it.is_array()) bad(ptr, fmt::format("'{}' must be a schema", rest));
      if (it.is_boolean() && !it.get<bool>())
        n.max_items = std::min<int64_t>(n.max_items, static_cast<int64_t>(n.prefix_items.size()));  // no further item
      else
        n.items = it.is_boolean() ? nullptr : node_at(fmt::format("{}/{}", ptr, rest));
    }
    auto count = [&](const char* k) -> int64_t {
      const J& v = s[k];
      if (!v.is_number_integer() || v.get<int64_t>() < 0) bad(ptr, fmt::format("'{}' must be a non-negative integer", k));
      return v.get<int64_t>();
    };
    if (s.contains("minLength")) n.min_length = count("minLength");
    if (s.contains("maxLength")) n.max_length = count("maxLength");
    if (n.min_length > n.max_length) bad(ptr, "'minLength' is above 'maxLength'");
    // pattern, or a format enforced as one (strings only; an enum's strings are given)
    const bool fmt_pattern = s.contains("format") && s["format"].is_string() && !StringPattern::format_pattern(s["format"].get<std::string>()).empty();
    if (s.contains("pattern") && !s["pattern"].is_string()) bad(ptr, "'pattern' must be a string");
    if (s.contains("pattern") && fmt_pattern)  // (both would have to hold: one automaton each)
      bad(ptr, fmt::format("'pattern' beside the 'format' {} (enforced as a pattern of its own) is not supported", s["format"].dump()));
    if ((s.contains("pattern") || fmt_pattern) && (n.types & JsonSchemaNode::kString)) {
      const bool own = s.contains("pattern");
      const std::string text = own ? s["pattern"].get<std::string>() : std::string(StringPattern::format_pattern(s["format"].get<std::string>()));
      std::string shown = J(text.substr(0, 200)).dump(-1, ' ', false, J::error_handler_t::replace);
      if (text.size() > 200) shown += fmt::format(" (the first 200 of {} bytes)", text.size());
      const std::string what = own ? fmt::format("json_schema {}: 'pattern' {}", ptr.empty() ? "(the root)" : ptr, shown)
                                   : fmt::format("json_schema {}: 'format' {}", ptr, s["format"].dump());
      const StringPattern& p = out_.patterns_.emplace_back(StringPattern::compile(text, what));
      const int32_t most = p.max_rest(p.start());
      if (!n.string_enum && (p.min_rest(p.start()) > n.max_length || (most != StringPattern::kUnbounded && most < n.min_length)))
        bad(ptr, fmt::format("'{}' and 'minLength' / 'maxLength' allow no string together", own ? "pattern" : "format"));
      n.pattern = &p;
    }
    // An enum's strings are given: those that break the string's other keywords are dropped.
    if (n.string_enum && (n.pattern || n.min_length > 0 || n.max_length < INT64_MAX)) {
      std::vector<std::string> kept;
      for (size_t i = 0; i < n.enum_strings.size(); ++i) {
        const int64_t chars = std::count_if(enum_raw[i].begin(), enum_raw[i].end(), [](char c) { return (static_cast<uint8_t>(c) & 0xC0) != 0x80; });
        if (chars >= n.min_length && chars <= n.max_length && (!n.pattern || n.pattern->matches(enum_raw[i]))) kept.push_back(n.enum_strings[i]);
      }
      n.enum_strings = std::move(kept);
      if (n.enum_strings.empty()) n.types &= ~JsonSchemaNode::kString;
      n.pattern = nullptr;
    }
    if (s.contains("minItems")) n.min_items = count("minItems");
    if (s.contains("maxItems")) n.max_items = std::min(n.max_items, count("maxItems"));
    if (n.min_items > n.max_items)
      bad(ptr, s.contains("maxItems") && n.max_items == s["maxItems"].get<int64_t>()
                   ? std::string("'minItems' is above 'maxItems'")
                   : fmt::format("the items' schemas allow at most {} items, but 'minItems' is {}", n.max_items, n.min_items));
    if (n.types == 0) bad(ptr, "the schema allows no value");
  }

 public:
  // Whether every node can end: some value of it is finite (a required property's or an item's
  // schema that only recurses into itself makes every value infinite: the model would write until
  // the nesting limit). A fixpoint from the nodes with a scalar type.
  void check_finite(const JsonSchemaNode* root) {
    std::map<const JsonSchemaNode*, bool> finite;
    for (const JsonSchemaNode& n : out_.nodes_) finite[&n] = false;
    for (bool changed = true; changed;) {
      changed = false;
      for (const JsonSchemaNode& n : out_.nodes_) {
        if (finite[&n]) continue;
        bool f = false;
        if (!n.branches.empty() || !n.tagged.empty() || !n.keyed.empty()) {
          for (const JsonSchemaNode* b : n.branches) f |= finite[b];
          for (const JsonSchemaNode* b : n.tagged) f |= finite[b];
          for (const JsonSchemaNode* b : n.keyed) f |= finite[b];
        } else {
          f = (n.types & (JsonSchemaNode::kString | JsonSchemaNode::kNumber | JsonSchemaNode::kInteger | JsonSchemaNode::kBoolean |
                          JsonSchemaNode::kNull)) != 0;
          if (!f && (n.types & JsonSchemaNode::kArray)) {
            f = true;  // the items up to minItems
            for (int64_t i = 0; i < n.min_items && i <= static_cast<int64_t>(n.prefix_items.size()); ++i)
              if (n.item(i) && !finite[n.item(i)]) f = false;
          }
          if (!f && (n.types & JsonSchemaNode::kObject)) {
            f = true;
            for (const auto& p : n.props)
              if (p.required && !finite[p.node]) f = false;
          }
        }
        if (f) finite[&n] = changed = true;
      }
    }
    if (!finite[root]) fail("json_schema: the schema allows no finite value (a required property or item recurses into itself with no way out)");
  }

  // JsonSchemaNode::min_depth of every node: a fixpoint like check_finite's, from the nodes that
  // allow a scalar (0).
  void set_min_depth() {
    constexpr int32_t kInf = 1 << 20;
    for (JsonSchemaNode& n : out_.nodes_) n.min_depth = kInf;
    auto md = [](const JsonSchemaNode* n) { return n ? n->min_depth : 0; };  // null items: any value
    for (bool changed = true; changed;) {
      changed = false;
      for (JsonSchemaNode& n : out_.nodes_) {
        int32_t m = kInf;
        if (!n.branches.empty() || !n.tagged.empty() || !n.keyed.empty()) {
          for (const JsonSchemaNode* b : n.branches) m = std::min(m, md(b));
          for (const JsonSchemaNode* b : n.tagged) m = std::min(m, md(b));
          for (const JsonSchemaNode* b : n.keyed) m = std::min(m, md(b));
        } else {
          if (n.types & (JsonSchemaNode::kString | JsonSchemaNode::kNumber | JsonSchemaNode::kInteger | JsonSchemaNode::kBoolean |
                         JsonSchemaNode::kNull))
            m = 0;
          if (n.types & JsonSchemaNode::kObject) {
            int32_t o = 1;
            for (const auto& p : n.props)
              if (p.required) o = std::max(o, 1 + md(p.node));
            m = std::min(m, o);
          }
          if (n.types & JsonSchemaNode::kArray) {
            int32_t a = 1;
            for (int64_t i = 0; i < n.min_items && i <= static_cast<int64_t>(n.prefix_items.size()); ++i) a = std::max(a, 1 + md(n.item(i)));
            m = std::min(m, a);
          }
        }
        m = std::min(m, kInf);
        if (m < n.min_depth) {
          n.min_depth = m;
          changed = true;
        }
      }
    }
  }

  static constexpr int kMaxNesting = 128;
  static constexpr size_t kMaxNodes = 4096;
  const J& root_;
  JsonSchema& out_;
  int depth_ = 0;
  std::map<std::string, const JsonSchemaNode*> memo_;
  std::set<std::string> resolving_;
  std::set<const JsonSchemaNode*> filling_;  // nodes whose members are being compiled
  std::vector<Union> deferred_;               // unions made after the whole schema (make_deferred)
  std::set<const JsonSchemaNode*> provisional_;  // their nodes until then
};

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  static const std::shared_ptr<const JsonSchema> s = [] {
    auto r = std::make_shared<JsonSchema>();
    JsonSchemaNode& n = r->nodes_.emplace_back();
    n.types = JsonSchemaNode::kObject;
    n.min_depth = 1;
    r->root_ = &n;
    return r;
  }();
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::compile(const nlohmann::ordered_json& schema) {
  auto r = std::make_shared<JsonSchema>();
  JsonSchemaCompiler c(schema, *r);
  r->root_ = c.node_at("");
  c.make_deferred();
  if (!(r->root_->types & JsonSchemaNode::kObject) || !r->root_->branches.empty())
    fail("json_schema: the root must be an object schema (\"type\": \"object\")");
  c.check_finite(r->root_);
  c.set_min_depth();
  return r;
}

JsonPrefix::JsonPrefix() : JsonPrefix(*JsonSchema::any_object()) {}

JsonPrefix::JsonPrefix(const JsonSchema& schema) : node_(schema.root()) {}

JsonPrefix& JsonPrefix::operator=(const JsonPrefix& o) {
  s_ = o.s_;
  ws_ = o.ws_;
  indent_ = o.indent_;
  key_ = o.key_;
  integer_ = o.integer_;
  left_ = o.left_;
  lo_ = o.lo_;
  hi_ = o.hi_;
  lit_ = o.lit_;
  off_ = o.off_;
  digits_ = o.digits_;
  neg_ = o.neg_;
  int_ = o.int_;
  frac_ = o.frac_;
  cp_ = o.cp_;
  re_ = o.re_;
  code_ = o.code_;
  chars_ = o.chars_;
  low_ = o.low_;
  choices_ = o.choices_;
  choice_base_ = o.choice_base_;
  prop_ = o.prop_;
  node_ = o.node_;
  depth_ = o.depth_;
  std::copy(o.frames_.begin(), o.frames_.begin() + o.depth_, frames_.begin());
  return *this;
}

bool JsonPrefix::feed(uint8_t c) {
  const JsonPrefix saved = *this;
  if (step(c)) return true;
  *this = saved;
  return false;
}

bool JsonPrefix::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!step(static_cast<uint8_t>(c))) return false;
  return true;
}

bool JsonPrefix::structural() const {
  switch (s_) {
    case S::value: case S::obj_first: case S::obj_key: case S::colon: case S::obj_next: case S::arr_first:
    case S::arr_next:
      return true;
    default:
      return false;
  }
}

// json.gbnf's ws: "" | " " | "\n" [ \t]{0,20}, between the tokens of the structure.
bool JsonPrefix::whitespace(uint8_t c) {
  if (c == ' ' || c == '\t') {
    if (ws_ == Ws::newline && indent_ < kMaxIndent) {
      ++indent_;
      return true;
    }
    if (ws_ == Ws::none && c == ' ') {
      ws_ = Ws::space;
      return true;
    }
    return false;
  }
  if (c == '\n' && ws_ == Ws::none) {
    ws_ = Ws::newline;
    indent_ = 0;
    return true;
  }
  return false;
}

void JsonPrefix::value_done() {
  if (depth_ == 0) {
    s_ = S::done;
    return;
  }
  Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  if (f.object) {
    s_ = S::obj_next;
  } else {
    ++f.next;
    s_ = S::arr_next;
  }
}

bool JsonPrefix::may_close_object() const {
  const Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  const JsonSchemaNode& o = *f.node;
  if (o.any_members) return true;
  if (!o.keyed.empty()) return o.keyed_empty;  // no key yet: {} if a branch takes it
  for (size_t i = static_cast<size_t>(f.next); i < o.props.size(); ++i)
    if (o.props[i].required) return false;
  return true;
}

bool JsonPrefix::fits(const JsonSchemaNode* v) const { return depth_ + (v ? v->min_depth : 0) <= kMaxDepth; }

int32_t JsonPrefix::object_depth(const JsonSchemaNode& n) {
  if (!n.tagged.empty() || !n.keyed.empty()) return n.min_depth;  // the shallowest branch the tag / key can pick
  int32_t d = 1;
  for (const auto& p : n.props)
    if (p.required) d = std::max(d, 1 + p.node->min_depth);
  return d;
}

int32_t JsonPrefix::array_depth(const JsonSchemaNode& n) {
  int32_t d = 1;
  for (int64_t i = 0; i < n.min_items && i <= static_cast<int64_t>(n.prefix_items.size()); ++i)
    if (n.item(i)) d = std::max(d, 1 + n.item(i)->min_depth);
  return d;
}

// The value a bounded number's text has (ending) or the values it can still become, against
// [lo, hi]: in the integral part P (d digits) any of [P*10^k, (P+1)*10^k) for the k more digits it
// may take, after the point the fraction's interval.
bool JsonPrefix::in_bounds(bool ending) const {
  const JsonSchemaNode& n = *node_;
  constexpr JsonUnits one = JsonSchemaNode::kOne;
  auto pow10 = [](int k) {
    JsonUnits p = 1;
    while (k-- > 0) p *= 10;
    return p;
  };
  auto meets = [&](JsonUnits a, JsonUnits b) {  // magnitudes [a, b] with the sign
    const JsonUnits l = neg_ ? -b : a, h = neg_ ? -a : b;
    return std::max(l, n.lo) <= std::min(h, n.hi);
  };
  const JsonUnits ip = static_cast<JsonUnits>(int_) * one;
  switch (s_) {
    case S::n_minus:
      return n.lo < 0;
    case S::n_zero:
      return ending ? meets(0, 0) : meets(0, integer_ ? 0 : one - 1);
    case S::n_int:
      if (ending) return meets(ip, ip);
      {
        JsonUnits w = 1;  // 10^k
        for (int k = 0; digits_ + k <= kMaxDigits; ++k, w *= 10)
          if (meets(ip * w, ip * w + w * one - (integer_ ? one : 1))) return true;
      }
      return false;
    case S::n_dot:
      return meets(ip, ip + one - 1);
    case S::n_frac: {
      const JsonUnits step = pow10(kBoundedFraction - digits_), v = ip + static_cast<JsonUnits>(frac_) * step;
      return ending ? meets(v, v) : meets(v, v + step - 1);
    }
    default:
      return false;
  }
}

bool JsonPrefix::pattern_char(uint32_t lo, uint32_t hi, bool commit) {
  const StringPattern& p = *node_->pattern;
  const StringPattern::Set next = p.step(re_, lo, std::max(lo, hi));
  if (StringPattern::empty(next)) return false;
  // chars_ counts this character; the pattern's rest must fit the length bounds
  if (chars_ + p.min_rest(next) > node_->max_length) return false;
  const int32_t most = p.max_rest(next);
  if (most != StringPattern::kUnbounded && chars_ + most < node_->min_length) return false;
  if (commit) re_ = next;
  return true;
}

// After a UTF-8 lead or continuation byte, left_ bytes still due, the next in [lo_, hi_]: the
// characters the bytes can still become are one range.
bool JsonPrefix::pattern_utf8() {
  const int rest = 6 * (left_ - 1);
  const uint32_t lo = ((cp_ << 6) | (lo_ & 0x3Fu)) << rest, hi = (((cp_ << 6) | (hi_ & 0x3Fu)) << rest) | ((1u << rest) - 1);
  return pattern_char(lo, hi, false);
}

bool JsonPrefix::may_add_member() const {
  const Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  if (f.node->any_members) return fits(f.node->additional);
  // a ',' only where some property may follow: one whose value can still end within kMaxDepth
  for (size_t i = static_cast<size_t>(f.next); i < f.node->props.size(); ++i)
    if (f.node->props[i].required || fits(f.node->props[i].node)) return true;
  return false;
}

// A '"' that opens a key: any string, or the properties that may come next (those up to and with
// the next required one).
bool JsonPrefix::open_key() {
  const Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
  const JsonSchemaNode& o = *f.node;
  key_ = true;
  if (o.any_members) {
    if (!fits(o.additional)) return false;  // its value could not end within kMaxDepth
    prop_ = -1;
    s_ = S::str;
    return true;
  }
  choices_ = 0;
  choice_base_ = f.next;
  for (size_t i = static_cast<size_t>(f.next); i < o.props.size(); ++i) {
    // an optional property whose value could not end within kMaxDepth is not begun (a required one
    // fits: the object was opened only if its required values do); a keyed union's key only when
    // its branch fits, and then as that branch's property
    const bool branch_fits = o.keyed.empty() || depth_ - 1 + o.keyed[i]->min_depth <= kMaxDepth;
    const bool required = o.keyed.empty() ? o.props[i].required : o.keyed[i]->props[static_cast<size_t>(o.keyed_prop[i])].required;
    if (branch_fits && (required || fits(o.props[i].node))) choices_ |= uint64_t{1} << (i - static_cast<size_t>(f.next));
    if (o.props[i].required) break;
  }
  if (choices_ == 0) return false;
  off_ = 0;
  s_ = S::str_choice;
  return true;
}

bool JsonPrefix::value(uint8_t c) {
  if (!node_->branches.empty()) {  // anyOf / oneOf: the branch this byte starts
    const uint8_t cls = c == '{' ? kSObj : c == '[' ? kSArr : c == '"' ? kSStr : c == 't' ? kSTrue : c == 'f' ? kSFalse
                        : c == 'n' ? kSNull : (c == '-' || is_digit(c)) ? kSNum : 0;
    for (const JsonSchemaNode* b : node_->branches)
      if (starts(*b) & cls) {
        node_ = b;
        return value(c);
      }
    return false;
  }
  const JsonSchemaNode& n = *node_;
  switch (c) {
    case '{':
    case '[':
      if (!(n.types & (c == '{' ? JsonSchemaNode::kObject : JsonSchemaNode::kArray))) return false;
      if (c == '[' && n.max_items == 0 && n.min_items > 0) return false;
      // Room for the shallowest value of this container (its required members, or items).
      if (depth_ + (c == '{' ? object_depth(n) : array_depth(n)) > kMaxDepth)
        return false;
      frames_[static_cast<size_t>(depth_++)] = Frame{&n, 0, c == '{'};
      s_ = c == '{' ? S::obj_first : S::arr_first;
      return true;
    case '"':
      if (!(n.types & JsonSchemaNode::kString)) return false;
      key_ = false;
      if (n.string_enum) {
        choices_ = n.enum_strings.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.enum_strings.size()) - 1;
        if (depth_ > 0) {  // a tagged union's tag: only the branches that can still end within kMaxDepth
          const Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
          if (f.object && !f.node->tagged.empty() && prop_ == 0 && &n == f.node->props[0].node)
            for (size_t i = 0; i < f.node->tagged.size() && i < 64; ++i)
              if (depth_ - 1 + f.node->tagged[i]->min_depth > kMaxDepth) choices_ &= ~(uint64_t{1} << i);
          if (choices_ == 0) return false;
        }
        off_ = 0;
        s_ = S::str_choice;
      } else {
        chars_ = 0;
        if (n.pattern) re_ = n.pattern->start();
        s_ = S::str;
      }
      return true;
    case 't':
    case 'f':
      if (!(n.types & JsonSchemaNode::kBoolean) || !(c == 't' ? n.allow_true : n.allow_false)) return false;
      lit_ = c == 't' ? "rue" : "alse";
      s_ = S::lit;
      return true;
    case 'n':
      if (!(n.types & JsonSchemaNode::kNull)) return false;
      lit_ = "ull";
      s_ = S::lit;
      return true;
    default:
      if (c != '-' && !is_digit(c)) return false;
      if (!(n.types & (JsonSchemaNode::kNumber | JsonSchemaNode::kInteger))) return false;
      if (n.number_enum) {  // the candidates this byte begins
        choices_ = 0;
        for (size_t b = 0; b < n.enum_numbers.size(); ++b)
          if (static_cast<uint8_t>(n.enum_numbers[b][0]) == c) choices_ |= uint64_t{1} << b;
        off_ = 1;
        s_ = S::n_choice;
        return choices_ != 0;
      }
      integer_ = !(n.types & JsonSchemaNode::kNumber);
      s_ = c == '-' ? S::n_minus : c == '0' ? S::n_zero : S::n_int;
      digits_ = 1;
      neg_ = c == '-';
      int_ = c == '-' ? 0 : c - '0';
      frac_ = 0;
      return !n.bounded || in_bounds(false);
  }
}

bool JsonPrefix::step(uint8_t c) {
  if (structural()) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return c != '\r' && whitespace(c);
    ws_ = Ws::none;
  }
  switch (s_) {
    case S::start:
      if (c != '{') return false;  // the reply is an object, from its first byte
      return value(c);
    case S::value:
      return value(c);
    case S::obj_first:
      if (c == '}') {
        if (!may_close_object()) return false;
        --depth_;
        value_done();
        return true;
      }
      [[fallthrough]];
    case S::obj_key:
      if (c != '"') return false;
      return open_key();
    case S::colon: {
      if (c != ':') return false;
      const Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
      node_ = prop_ >= 0 ? f.node->props[static_cast<size_t>(prop_)].node : f.node->additional ? f.node->additional : &kAnyNode;
      s_ = S::value;
      return true;
    }
    case S::obj_next:
      if (c == ',') {
        if (!may_add_member()) return false;
        s_ = S::obj_key;
        return true;
      }
      if (c != '}' || !may_close_object()) return false;
      --depth_;
      value_done();
      return true;
    case S::arr_first:
    case S::arr_next: {
      const Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
      const JsonSchemaNode& a = *f.node;
      if (c == ']') {
        if (f.next < a.min_items) return false;
        --depth_;
        value_done();
        return true;
      }
      const JsonSchemaNode* items = a.item(f.next) ? a.item(f.next) : &kAnyNode;
      // an item past minItems is begun only if it can end within kMaxDepth
      const bool room = f.next < a.min_items || fits(items);
      if (s_ == S::arr_next) {
        if (c != ',' || f.next >= a.max_items || !room) return false;
        node_ = items;
        s_ = S::value;
        return true;
      }
      if (a.max_items == 0 || !room) return false;
      node_ = items;
      return value(c);
    }
    case S::str_choice: {
      // The bytes must follow one of the candidates: property names (key_) or enum strings.
      const JsonSchemaNode& owner = key_ ? *frames_[static_cast<size_t>(depth_ - 1)].node : *node_;
      auto cand = [&](int b) -> const std::string& {
        return key_ ? owner.props[static_cast<size_t>(choice_base_ + b)].key : owner.enum_strings[static_cast<size_t>(b)];
      };
      // A '"' inside a candidate is escaped (its written form is valid JSON), so it continues that
      // candidate; otherwise it closes the string.
      bool continues = false;
      if (c == '"')
        for (int b = 0; b < 64 && !continues; ++b)
          continues = ((choices_ >> b) & 1) && cand(b).size() > off_ && cand(b)[off_] == '"';
      if (c == '"' && !continues) {
        for (int b = 0; b < 64; ++b)
          if (((choices_ >> b) & 1) && cand(b).size() == off_) {
            if (key_) {
              prop_ = choice_base_ + b;
              Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
              if (!f.node->keyed.empty()) {  // a keyed union: the object goes on as the branch this key begins
                const size_t i = static_cast<size_t>(prop_);
                prop_ = f.node->keyed_prop[i];
                f.node = f.node->keyed[i];
              }
              f.next = prop_ + 1;
              s_ = S::colon;
            } else {
              // A tagged union's tag: the object goes on as the branch the string names.
              if (depth_ > 0) {
                Frame& f = frames_[static_cast<size_t>(depth_ - 1)];
                if (f.object && !f.node->tagged.empty() && prop_ == 0 && node_ == f.node->props[0].node)
                  f.node = f.node->tagged[static_cast<size_t>(b)];
              }
              value_done();
            }
            return true;
          }
        return false;
      }
      uint64_t next = 0;
      for (int b = 0; b < 64; ++b)
        if (((choices_ >> b) & 1) && cand(b).size() > off_ && static_cast<uint8_t>(cand(b)[off_]) == c) next |= uint64_t{1} << b;
      if (next == 0) return false;
      choices_ = next;
      ++off_;
      return true;
    }
    case S::str:
      if (c == '"') {
        if (key_) {
          s_ = S::colon;
        } else {
          if (chars_ < node_->min_length) return false;
          if (node_->pattern && !node_->pattern->accepts(re_)) return false;
          value_done();
        }
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      // A character begins (an escape, an ASCII byte or a UTF-8 lead byte; a surrogate pair's low
      // half and continuation bytes do not): a value's count against maxLength.
      if (!key_ && chars_++ >= node_->max_length) return false;
      if (c == '\\') {
        s_ = S::str_esc;
        if (!patterned()) return true;
        for (uint8_t e : {'"', '\\', '/', '\b', '\f', '\n', '\r', '\t'})  // what the escape can stand for
          if (pattern_char(e, e, false)) return true;
        return false;
      }
      if (c < 0x80) return !patterned() || pattern_char(c, c, true);
      // UTF-8 lead bytes (RFC 3629 table): the range of the first continuation byte, then 80..BF.
      lo_ = 0x80;
      hi_ = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        left_ = 1;
        cp_ = c & 0x1F;
      } else if (c >= 0xE0 && c <= 0xEF) {
        left_ = 2;
        cp_ = c & 0x0F;
        if (c == 0xE0) lo_ = 0xA0;
        if (c == 0xED) hi_ = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        left_ = 3;
        cp_ = c & 0x07;
        if (c == 0xF0) lo_ = 0x90;
        if (c == 0xF4) hi_ = 0x8F;
      } else {
        return false;
      }
      s_ = S::str_utf8;
      return !patterned() || pattern_utf8();
    case S::str_utf8:
      if (c < lo_ || c > hi_) return false;
      lo_ = 0x80;
      hi_ = 0xBF;
      cp_ = cp_ << 6 | (c & 0x3F);
      if (--left_ == 0) {
        s_ = S::str;
        return !patterned() || pattern_char(cp_, cp_, true);
      }
      return !patterned() || pattern_utf8();
    case S::str_esc:
      if (c == 'u') {
        if (patterned()) return false;  // (a pattern's string takes its characters unescaped)
        left_ = 4;
        code_ = 0;
        low_ = false;
        s_ = S::str_u;
        return true;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
      s_ = S::str;
      if (!patterned()) return true;
      return pattern_char(c == 'b' ? 0x08 : c == 'f' ? 0x0C : c == 'n' ? 0x0A : c == 'r' ? 0x0D : c == 't' ? 0x09 : c, 0, true);
    case S::str_u: {
      if (!is_hex(c)) return false;
      code_ = static_cast<uint16_t>(code_ * 16 + (is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10));
      if (--left_ > 0) return true;
      // UTF-16 surrogates come in pairs (RFC 8259 7): a high one, then \u and a low one.
      const bool high = code_ >= 0xD800 && code_ <= 0xDBFF, low = code_ >= 0xDC00 && code_ <= 0xDFFF;
      if (low_ ? !low : low) return false;
      s_ = high && !low_ ? S::str_lo_bs : S::str;
      return true;
    }
    case S::str_lo_bs:
      if (c != '\\') return false;
      s_ = S::str_lo_u;
      return true;
    case S::str_lo_u:
      if (c != 'u') return false;
      left_ = 4;
      code_ = 0;
      low_ = true;
      s_ = S::str_u;
      return true;
    case S::n_choice: {  // one of node_'s enum_numbers
      const auto& cand = node_->enum_numbers;
      uint64_t next = 0;
      bool whole = false;
      for (size_t b = 0; b < cand.size(); ++b) {
        if (!((choices_ >> b) & 1)) continue;
        if (cand[b].size() > off_ && static_cast<uint8_t>(cand[b][off_]) == c) next |= uint64_t{1} << b;
        whole |= cand[b].size() == off_;
      }
      if (next != 0) {
        choices_ = next;
        ++off_;
        return true;
      }
      if (!whole) return false;
      value_done();  // the number ends here: the byte belongs to what follows it
      if (s_ == S::done) return false;
      return step(c);
    }
    case S::lit:
      if (c != static_cast<uint8_t>(*lit_)) return false;
      if (*++lit_ == 0) value_done();
      return true;
    case S::n_minus:
      if (!is_digit(c)) return false;
      s_ = c == '0' ? S::n_zero : S::n_int;
      digits_ = 1;
      int_ = c - '0';
      return !node_->bounded || in_bounds(false);
    case S::n_dot:
    case S::n_esign:
      if (!is_digit(c)) return false;
      s_ = s_ == S::n_dot ? S::n_frac : S::n_exp;
      digits_ = 1;
      if (s_ == S::n_frac) frac_ = c - '0';
      return s_ != S::n_frac || !node_->bounded || in_bounds(false);
    case S::n_e:
      if (c == '+' || c == '-') {
        s_ = S::n_esign;
        return true;
      }
      if (!is_digit(c)) return false;
      s_ = S::n_exp;
      digits_ = 1;
      return true;
    case S::n_int:
    case S::n_frac:
    case S::n_exp:
      if (is_digit(c)) {
        if (!node_->bounded) return ++digits_ <= (s_ == S::n_frac ? kMaxFraction : s_ == S::n_exp ? kMaxExponent : kMaxDigits);
        if (++digits_ > (s_ == S::n_frac ? kBoundedFraction : kMaxDigits)) return false;
        (s_ == S::n_frac ? frac_ : int_) = (s_ == S::n_frac ? frac_ : int_) * 10 + (c - '0');
        return in_bounds(false);
      }
      [[fallthrough]];
    case S::n_zero:
      if (c == '.' && !integer_ && (s_ == S::n_zero || s_ == S::n_int)) {
        s_ = S::n_dot;
        return !node_->bounded || in_bounds(false);
      }
      if ((c == 'e' || c == 'E') && !integer_ && s_ != S::n_exp && !node_->bounded) {
        s_ = S::n_e;
        return true;
      }
      // The number ends here: the byte belongs to what follows it.
      if (node_->bounded && !in_bounds(true)) return false;
      value_done();
      if (s_ == S::done) return false;  // (a number is never the top-level value)
      return step(c);
    case S::done:
      return false;
  }
  return false;
}

JsonTokenMask::JsonTokenMask(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  for (size_t id = 0; id < bytes_.size(); ++id)
    if (!bytes_[id].empty()) order_.push_back(static_cast<int32_t>(id));
  std::stable_sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) { return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)]; });
  lcp_.assign(order_.size(), 0);
  for (size_t i = 0; i < order_.size(); ++i) {
    const std::string& t = bytes_[static_cast<size_t>(order_[i])];
    max_len_ = std::max(max_len_, t.size());
    if (i == 0) continue;
    const std::string& p = bytes_[static_cast<size_t>(order_[i - 1])];
    size_t l = 0;
    while (l < t.size() && l < p.size() && t[l] == p[l]) ++l;
    lcp_[i] = static_cast<uint32_t>(l);
  }
}

std::unique_ptr<JsonTokenMask> JsonTokenMask::of(const Tokenizer& tokenizer, int64_t n_vocab) {
  std::vector<std::string> bytes(static_cast<size_t>(n_vocab));
  const int32_t ordinary = tokenizer.bos_id == 0 ? 1 : 0;
  for (int32_t id = 0; id < n_vocab && id < tokenizer.n_vocab(); ++id) bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(ordinary, id);
  return std::make_unique<JsonTokenMask>(std::move(bytes));
}

int64_t JsonTokenMask::allowed(const JsonPrefix& prefix, std::vector<uint8_t>& allowed) const {
  allowed.assign(bytes_.size(), 0);
  // states[k]: the prefix after the first k bytes of the current token; valid up to `valid`.
  thread_local std::vector<JsonPrefix> states;
  if (states.size() < max_len_ + 1) states.resize(max_len_ + 1);
  states[0] = prefix;
  size_t valid = 0;
  int64_t n = 0;
  for (size_t i = 0; i < order_.size();) {
    const std::string& t = bytes_[static_cast<size_t>(order_[i])];
    size_t k = std::min<size_t>(lcp_[i], valid);
    bool ok = true;
    for (; k < t.size(); ++k) {
      states[k + 1] = states[k];
      if (!states[k + 1].feed(std::string_view(&t[k], 1))) {  // (no undo copy: a scratch state)
        ok = false;
        break;
      }
    }
    if (ok) {
      allowed[static_cast<size_t>(order_[i])] = 1;
      ++n;
      valid = t.size();
      ++i;
      continue;
    }
    // Byte k does not fit: neither does any following token that shares bytes 0..k.
    valid = k;
    for (++i; i < order_.size() && lcp_[i] > k; ++i) {
    }
  }
  return n;
}

int64_t JsonTokenMask::allowed_each(const JsonPrefix& prefix, std::vector<uint8_t>& allowed) const {
  allowed.assign(bytes_.size(), 0);
  int64_t n = 0;
  JsonPrefix p;
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& b = bytes_[id];
    if (b.empty()) continue;
    p = prefix;
    if (p.feed(b)) {
      allowed[id] = 1;
      ++n;
    }
  }
  return n;
}

}  // namespace mk
