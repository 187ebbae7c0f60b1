// JSON-object constrained decoding (runtime/json_prefix.h): the prefix automaton accepts exactly
// the prefixes of one JSON object (checked against nlohmann's parser on documents it writes and on
// hand-picked invalid ones, byte by byte), with json.gbnf's whitespace; the token mask allows the
// tokens whose bytes continue the prefix; the engine's json_object requests give valid JSON.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>

#include "runtime/json_prefix.h"
#include "runtime/string_pattern.h"
#include "support/error.h"
#include "support/errors.h"

namespace mk {
namespace {

// How many leading bytes of `text` the automaton takes (text.size() when all).
size_t accepted(const std::string& text, JsonObjectPrefix* out = nullptr) {
  JsonObjectPrefix p;
  size_t i = 0;
  for (; i < text.size(); ++i)
    if (!p.feed(static_cast<uint8_t>(text[i]))) break;
  if (out) *out = p;
  return i;
}

bool complete(const std::string& text) {
  JsonObjectPrefix p;
  return accepted(text, &p) == text.size() && p.complete();
}

nlohmann::json random_value(std::mt19937& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 3 ? 5 : 7);
  switch (kind(rng)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng() % 2000000) - 1000000;
    case 3: return std::ldexp(static_cast<double>(rng() % 100000) - 50000, static_cast<int>(rng() % 80) - 40);
    case 4:
    case 5: {
      static const char* pieces[] = {"a", "\"", "\\", "\n", "\t", "\x01", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x99\x82", " ", "/", "x y"};
      std::string s;
      for (int i = static_cast<int>(rng() % 6); i > 0; --i) s += pieces[rng() % std::size(pieces)];
      return s;
    }
    case 6: {
      nlohmann::json a = nlohmann::json::array();
      for (int i = static_cast<int>(rng() % 4); i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      for (int i = static_cast<int>(rng() % 4); i > 0; --i) o["k" + std::to_string(rng() % 9)] = random_value(rng, depth + 1);
      return o;
    }
  }
}

TEST(JsonPrefix, AcceptsWhatNlohmannWritesAndEveryPrefixOfIt) {
  std::mt19937 rng(7);
  for (int n = 0; n < 400; ++n) {
    nlohmann::json doc = nlohmann::json::object();
    for (int i = static_cast<int>(rng() % 5); i > 0; --i) doc["key" + std::to_string(i)] = random_value(rng, 1);
    for (int indent : {-1, 2}) {  // compact, and a newline + 2 spaces a level (at most 20 here)
      const std::string text = doc.dump(indent);
      JsonObjectPrefix p;
      for (size_t i = 0; i < text.size(); ++i) {
        ASSERT_FALSE(p.complete()) << text << " at " << i;
        ASSERT_TRUE(p.feed(static_cast<uint8_t>(text[i]))) << text << " at byte " << i;
      }
      EXPECT_TRUE(p.complete()) << text;
      EXPECT_FALSE(p.feed(' ')) << "nothing after the object";
    }
  }
}

TEST(JsonPrefix, RefusesTheByteWhereTextStopsBeingJson) {
  const std::pair<std::string, size_t> cases[] = {
      {"[1]", 0},                  // the reply is an object
      {" {}", 0},                  // from its first byte
      {"{\"a\":01}", 6},           // no leading zeros
      {"{\"a\":-}", 6},            // a sign needs digits
      {"{\"a\":1.}", 7},           // a point needs digits
      {"{\"a\":1e}", 7},           // an exponent needs digits
      {"{\"a\":.5}", 5},
      {"{\"a\":12345678901234567}", 21},       // at most 16 digits (json.gbnf)
      {"{\"a\":1." + std::string(33, '1') + "}", 39},  // 32 after the point
      {"{\"a\":+1}", 5},
      {"{\"a\":tru}", 8},
      {"{\"a\":nul1}", 8},
      {"{\"a\" 1}", 5},            // a colon after a key
      {"{\"a\":1,}", 7},           // no trailing comma
      {"{,}", 1},
      {"{\"a\":[1,]}", 8},
      {"{\"a\":[1 2]}", 8},
      {"{1:2}", 1},                // keys are strings
      {"{\"a\":\"\x01\"}", 6},     // control characters are escaped
      {"{\"a\":\"\\x\"}", 7},      // unknown escape
      {"{\"a\":\"\\u12g4\"}", 10},
      {"{\"\xc0\x80\":1}", 2},     // overlong UTF-8
      {"{\"\xed\xa0\x80\":1}", 3}, // a surrogate
      {"{\"\xf5\x80\x80\x80\":1}", 2},
      {"{\"\xe2\x82\":1}", 4},     // a cut character
      {"{\"a\":1}}", 7},           // nothing after the object
      {"{  \"a\":1}", 2},          // whitespace: one space ...
      {"{ \n\"a\":1}", 2},          // ... or a newline and spaces / tabs
      {"{\n\n\"a\":1}", 2},
      {"{\r\n\"a\":1}", 1},
      {"{\"a\":1\n" + std::string(21, ' ') + "}", 27},  // at most 20 after the newline
  };
  for (const auto& [text, at] : cases) {
    EXPECT_EQ(accepted(text), at) << text;
    // Every case but the whitespace ones (json.gbnf's rule, stricter than RFC 8259) is invalid JSON.
    const bool ws_rule = text.find_first_of(" \n\r\t") != std::string::npos || text.find("1234567890123456") != std::string::npos ||
                         text.find(std::string(33, '1')) != std::string::npos;
    EXPECT_TRUE(ws_rule || !nlohmann::json::accept(text) || text[0] != '{') << text << ": nlohmann takes it";
  }
  for (const char* ok : {"{}", "{\"a\":-0.5E-3}", "{\"a\":1e+5,\"b\":[true,false,null,{}],\"c\":\"\\u00e9\\n\\/\"}",
                         "{ \"a\" : [ 1 , 2 ] }", "{\n\t \"a\":1}", "{\n  \"a\": {\n    \"b\": []\n  }\n}", "{\"\xf0\x9f\x99\x82\":\"\xe2\x82\xac\"}"}) {
    EXPECT_TRUE(complete(ok)) << ok;
    EXPECT_TRUE(nlohmann::json::accept(ok)) << ok;
  }
  std::string deep = "{\"a\":";
  for (int i = 1; i < JsonObjectPrefix::kMaxDepth; ++i) deep += "[";
  EXPECT_EQ(accepted(deep + "["), deep.size());  // nesting deeper than kMaxDepth
}

TEST(JsonPrefix, TokenMaskAllowsTokensWhoseBytesContinueThePrefix) {
  const JsonTokenMask mask({"{", "}", "\"a\"", ":", "1", "x", "", "{\"", " \"b\": 2}", "\n\n"});
  JsonObjectPrefix p;
  std::vector<uint8_t> allowed;
  EXPECT_EQ(mask.allowed(p, allowed), 2);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{1, 0, 0, 0, 0, 0, 0, 1, 0, 0}));
  ASSERT_TRUE(p.feed("{"));
  mask.allowed(p, allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 1, 1, 0, 0, 0, 0, 0, 1, 0}));
  ASSERT_TRUE(p.feed(mask.bytes(8)));
  EXPECT_TRUE(p.complete());
  EXPECT_EQ(mask.allowed(p, allowed), 0);
}

}  // namespace
}  // namespace mk

namespace mk {
namespace {

using J = nlohmann::ordered_json;

size_t accepted_by(const JsonSchema& schema, const std::string& text, bool* whole = nullptr) {
  JsonPrefix p(schema);
  size_t i = 0;
  for (; i < text.size(); ++i)
    if (!p.feed(static_cast<uint8_t>(text[i]))) break;
  if (whole) *whole = i == text.size() && p.complete();
  return i;
}

// Feeds the first byte of `order` that continues `p` and appends it to `out`; false when none does.
bool feed_first(JsonPrefix& p, const std::string& order, std::string& out) {
  for (char c : order)
    if (p.feed(static_cast<uint8_t>(c))) {
      out += c;
      return true;
    }
  return false;
}

// A pydantic-style schema: $defs and $ref (a recursive one), Optional as anyOf [X, null], enums,
// arrays with bounds, integers, nested objects.
const J kPerson = J::parse(R"({
  "$defs": {
    "Color": {"enum": ["red", "green", "blue"], "title": "Color", "type": "string"},
    "Pet": {"properties": {"name": {"type": "string"}, "legs": {"type": "integer"}}, "required": ["name"], "type": "object"},
    "Node": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
             "required": ["v", "kids"]}
  },
  "properties": {
    "name": {"title": "Name", "type": "string"},
    "age": {"type": "integer"},
    "height": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": null},
    "color": {"$ref": "#/$defs/Color"},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
    "pets": {"type": "array", "items": {"$ref": "#/$defs/Pet"}},
    "ok": {"type": "boolean"},
    "tree": {"$ref": "#/$defs/Node"},
    "extra": {"type": "object"}
  },
  "required": ["name", "age", "color", "tags"],
  "title": "Person", "type": "object"
})");

TEST(JsonSchema, AcceptsInstancesInPropertyOrderAndEveryPrefix) {
  const auto schema = JsonSchema::compile(kPerson);
  for (const char* doc : {
           R"({"name":"Ann","age":31,"color":"red","tags":["a"]})",
           R"({"name":"Bo","age":-2,"height":1.85,"color":"blue","tags":["x","y"],"pets":[],"ok":false})",
           R"({"name":"C","age":0,"height":null,"color":"green","tags":["t"],"pets":[{"name":"Rex","legs":4},{"name":"Tweety"}],)"
           R"("ok":true,"tree":{"v":1,"kids":[{"v":2,"kids":[]}]},"extra":{"any":[1,{"x":null}]}})",
           "{\n  \"name\": \"D\",\n  \"age\": 5,\n  \"color\": \"red\",\n  \"tags\": [\n    \"q\"\n  ]\n}"}) {
    bool whole = false;
    EXPECT_EQ(accepted_by(*schema, doc, &whole), std::string(doc).size()) << doc;
    EXPECT_TRUE(whole) << doc;
    EXPECT_TRUE(J::accept(doc)) << doc;
  }
}

TEST(JsonSchema, RefusesTheByteWhereTheInstanceLeavesTheSchema) {
  const auto schema = JsonSchema::compile(kPerson);
  const std::string head = R"({"name":"A","age":1,"color":"red","tags":["a"])";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"age":1,)", "{\""},                                   // required "name" comes first
      {R"({"name":"A","color":)", R"({"name":"A",")"},            // "age" is required before "color"
      {R"({"name":"A","age":1.5)", R"({"name":"A","age":1)"},     // an integer
      {R"({"name":"A","age":1e3)", R"({"name":"A","age":1)"},
      {R"({"name":"A","age":"1")", R"({"name":"A","age":)"},      // not a string
      {R"({"name":"A","age":1,"color":"pink")", R"({"name":"A","age":1,"color":")"},  // enum
      {R"({"name":"A","age":1,"color":"red","tags":[])", R"({"name":"A","age":1,"color":"red","tags":[)"},  // minItems 1
      {R"({"name":"A","age":1,"color":"red","tags":["a","b","c")", R"({"name":"A","age":1,"color":"red","tags":["a","b")"},
      {R"({"name":"A","age":1})", R"({"name":"A","age":1)"},      // color and tags are required
      {head + R"(,"nick":1)", head + ",\""},                      // no other keys
      {head + R"(,"ok":true,"height":2)", head + R"(,"ok":true,")"},  // in the schema's order
      {R"({"name":"A","age":1,"height":true)", R"({"name":"A","age":1,"height":)"},  // number or null
      {head + R"(,"pets":[{"legs":4}])", head + R"(,"pets":[{")"},  // a pet's name is required
      {head + R"(,"tree":{"v":1})", head + R"(,"tree":{"v":1)"},  // kids are required, recursively
  };
  for (const auto& [text, ok_prefix] : cases) {
    EXPECT_EQ(accepted_by(*schema, text), ok_prefix.size()) << text;
  }
}

// Discriminated unions (pydantic's Field(discriminator=...) writes them as anyOf / oneOf of objects
// whose first property is a Literal): the tag's string picks the branch; the rest of the object must
// fit that branch. Tags that overlap, or branches that are not so tagged, stay refused.
TEST(JsonSchema, TaggedUnionsFollowTheBranchTheirTagNames) {
  const auto schema = JsonSchema::compile(J::parse(R"({"type": "object", "properties": {"pet": {"oneOf": [
      {"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"type": "object", "properties": {"kind": {"enum": ["fish", "eel"]},
       "water": {"enum": ["salt", "fresh"]}}, "required": ["kind", "water"]}]}}, "required": ["pet"],
      "$defs": {"Cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                        "required": ["kind", "lives"]},
                "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"},
                        "pups": {"type": "array", "items": {"$ref": "#/$defs/Dog"}}}, "required": ["kind"]}}})"));
  for (const char* doc : {R"({"pet":{"kind":"cat","lives":9}})", R"({"pet":{"kind":"dog"}})",
                          R"({"pet":{"kind":"dog","good":true,"pups":[{"kind":"dog","pups":[]}]}})",
                          R"({"pet":{"kind":"eel","water":"fresh"}})", R"({"pet": {"kind": "fish", "water": "salt"}})"}) {
    bool whole = false;
    EXPECT_EQ(accepted_by(*schema, doc, &whole), std::string(doc).size()) << doc;
    EXPECT_TRUE(whole) << doc;
  }
  const std::pair<std::string, std::string> refused[] = {
      {R"({"pet":{"kind":"cat","good":true)", R"({"pet":{"kind":"cat",")"},   // a dog's member after the cat's tag
      {R"({"pet":{"kind":"cat"})", R"({"pet":{"kind":"cat")"},                 // a cat's lives are required
      {R"({"pet":{"kind":"cow")", R"({"pet":{"kind":"c)"},                      // no such tag
      {R"({"pet":{"lives":9)", R"({"pet":{")"},                                 // the tag comes first
      {R"({"pet":{"kind":"dog","pups":[{"kind":"cat")", R"({"pet":{"kind":"dog","pups":[{"kind":")"},  // pups are dogs
      {R"({"pet":"cat")", R"({"pet":)"},
  };
  for (const auto& [text, ok_prefix] : refused) EXPECT_EQ(accepted_by(*schema, text), ok_prefix.size()) << text;
  // At the root too (a forced tool call among several functions is such a union).
  const auto root = JsonSchema::compile(J::parse(R"({"anyOf": [
      {"type": "object", "properties": {"name": {"const": "a"}, "arguments": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}, "required": ["name", "arguments"]},
      {"type": "object", "properties": {"name": {"const": "b"}, "arguments": {"type": "object"}}, "required": ["name", "arguments"]}]})"));
  bool whole = false;
  EXPECT_EQ(accepted_by(*root, R"({"name":"a","arguments":{"x":1}})", &whole), 32u);
  EXPECT_TRUE(whole);
  EXPECT_EQ(accepted_by(*root, R"({"name":"a","arguments":{"y":1}})"), std::string(R"({"name":"a","arguments":{")").size());
  // pydantic's form: a Literal tag with a default (so not in `required`), OpenAPI's `discriminator`
  // beside oneOf, and the union beside null (Optional[Union[...]]), flat: the tag is written first.
  const auto py = JsonSchema::compile(J::parse(R"({"type": "object", "properties": {"pet": {"anyOf": [
      {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "discriminator": {"propertyName": "pet_type",
        "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}}, {"type": "null"}]},
      "flat": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"type": "null"}, {"type": "string"}]}},
      "required": ["pet", "flat"],
      "$defs": {"Cat": {"type": "object", "properties": {"pet_type": {"const": "cat", "default": "cat"}, "meows": {"type": "integer"}},
                        "required": ["meows"]},
                "Dog": {"type": "object", "properties": {"pet_type": {"const": "dog", "default": "dog"}, "barks": {"type": "number"}},
                        "required": ["barks"]}}})"));
  for (const char* doc : {R"({"pet":{"pet_type":"cat","meows":3},"flat":null})", R"({"pet":null,"flat":{"pet_type":"dog","barks":1.5}})",
                          R"({"pet":{"pet_type":"dog","barks":2},"flat":"x"})"}) {
    bool whole = false;
    EXPECT_EQ(accepted_by(*py, doc, &whole), std::string(doc).size()) << doc;
    EXPECT_TRUE(whole) << doc;
  }
  EXPECT_EQ(accepted_by(*py, R"({"pet":{"meows":3)"), std::string(R"({"pet":{")").size());  // the tag first
  EXPECT_EQ(accepted_by(*py, R"({"pet":null,"flat":{"pet_type":"cat","barks")"), std::string(R"({"pet":null,"flat":{"pet_type":"cat",")").size());
  // Not tagged unions, each refused with the reason: overlapping tags, different first keys, a tag
  // that is not a string enum, a non-object branch that also begins with '{', too many tags.
  std::string many = R"({"type":"object","properties":{"p":{"anyOf":[)";
  for (int i = 0; i < 65; ++i) many += fmt::format(R"({}{{"type":"object","properties":{{"k":{{"const":"t{}"}}}},"required":["k"]}})", i ? "," : "", i);
  many += "]}}}";
  const std::pair<std::string, std::string> bad[] = {
      {R"({"type":"object","properties":{"p":{"anyOf":[{"type":"object","properties":{"k":{"enum":["a","b"]}},"required":["k"]},{"type":"object","properties":{"k":{"const":"b"}},"required":["k"]}]}}})",
       "the tag \"b\" names two branches"},
      {R"({"type":"object","properties":{"p":{"anyOf":[{"type":"object","properties":{"k":{"const":"a"}},"required":["k"]},{"type":"object","properties":{"t":{"const":"b"},"k":{"const":"c"}},"required":["k"]}]}}})",
       "first property is \"t\", another's \"k\""},
      {R"({"type":"object","properties":{"p":{"anyOf":[{"type":"object","properties":{"k":{"const":"a"}},"required":["k"]},{"type":"object","properties":{"t":{"const":"b"},"k":{"const":"c"}},"required":["k"]}]}}})",
       "branches 0 and 1 can both begin with \"k\""},
      {R"({"type":"object","properties":{"p":{"anyOf":[{"type":"object","properties":{"k":{"type":"string"}},"required":["k"]},{"type":"object","properties":{"k":{"const":"b"}},"required":["k"]}]}}})",
       "branch 0's first property \"k\" is not a const / enum string"},
      {R"({"type":"object","properties":{"p":{"anyOf":[{"type":"object","properties":{"k":{"const":"a"}}},{"type":["object","null"]}]}}})",
       "branches whose values can begin alike are not supported"},
      {many, "65 tags, more than 64"},
  };
  for (const auto& [text, want] : bad) {
    const std::string e = test::error_of([&] { JsonSchema::compile(J::parse(text)); });  // ("<no error>" if accepted)
    EXPECT_NE(e.find(want), std::string::npos) << text << ": " << e;
  }
}

// Deep recursive schemas (new-user trial 47: pydantic's TreeNode / linked lists as forced tool
// calls): at the nesting limit the automaton must never have begun a value it cannot end. A random
// walk that prefers going deeper always finds a byte that continues, and ends; numbers keep a
// finite exponent (2 digits).
TEST(JsonSchema, DeepRecursionNeverReachesADeadEnd) {
  const char* schemas[] = {
      R"({"type":"object","properties":{"a":{"$ref":"#"}}})",
      // pydantic's TreeNode (trial 47): a ',' after "value" where only "children" could follow
      R"({"type":"object","properties":{"value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#"}}},"required":["value"]})",
      R"({"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["v","next"]})",
      R"({"type":"object","properties":{"value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#"}}},"required":["value","children"]})",
      R"({"type":"object","properties":{"k":{"type":"array","items":{"type":"array","items":{"$ref":"#"}},"minItems":1}},"required":[]})",
      R"({"type":"object","properties":{"node":{"oneOf":[{"type":"object","properties":{"t":{"const":"leaf"},"x":{"type":"boolean"}},"required":["t","x"]},
          {"type":"object","properties":{"t":{"const":"pair"},"l":{"$ref":"#/properties/node"},"r":{"$ref":"#/properties/node"}},"required":["t","l","r"]}]}},"required":["node"]})",
      // an untagged union told apart by its first key, recursive below it
      R"({"type":"object","properties":{"t":{"$ref":"#/$defs/T"}},"required":["t"],"$defs":{"T":{"anyOf":[
          {"type":"object","properties":{"leaf":{"type":"integer"}},"required":["leaf"]},
          {"type":"object","properties":{"n":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/T"},"minItems":1}},"required":["kids"]}]}}})",
  };
  // Opening bytes first (a model that always goes deeper), then the rest.
  const std::string deeper = "{[\"", rest = "}],:0123456789.-nulltruefalse ";
  std::mt19937 rng(7);
  for (const char* text : schemas) {
    const auto schema = JsonSchema::compile(J::parse(text));
    for (int walk = 0; walk < 5; ++walk) {
      JsonPrefix p(*schema);
      std::string out;
      int max_depth_seen = 0, depth = 0;
      bool ended = false;
      for (int step = 0; step < 30000 && !ended; ++step) {
        // inside a string: mostly letters, sometimes the closing quote
        std::string order = deeper + rest + "abcdefghijklmnopqrstuvwxyz";
        std::shuffle(order.begin() + static_cast<long>(deeper.size()), order.end(), rng);
        if (rng() % 4 == 0) std::shuffle(order.begin(), order.end(), rng);  // sometimes anything first
        bool moved = false;
        for (char c : order) {
          JsonPrefix q = p;
          if (!q.feed(static_cast<uint8_t>(c))) continue;
          p = q;
          out += c;
          depth += c == '{' || c == '[' ? 1 : c == '}' || c == ']' ? -1 : 0;  // (strings hold none of these here)
          max_depth_seen = std::max(max_depth_seen, depth);
          moved = true;
          break;
        }
        ASSERT_TRUE(moved) << text << ": no byte continues " << out.substr(out.size() > 200 ? out.size() - 200 : 0);
        ended = p.complete();
      }
      EXPECT_LE(max_depth_seen, JsonPrefix::kMaxDepth) << text;
      if (ended) {
        EXPECT_TRUE(J::accept(out)) << out;
      }
    }
  }
  // A property whose value would need one more level than is left is not begun: '}' is the way out.
  const auto a = JsonSchema::compile(J::parse(schemas[0]));
  std::string deep;
  for (int i = 0; i < JsonPrefix::kMaxDepth - 1; ++i) deep += R"({"a":)";
  deep += "{";
  EXPECT_EQ(accepted_by(*a, deep + "\""), deep.size());
  bool whole = false;
  EXPECT_EQ(accepted_by(*a, deep + std::string(JsonPrefix::kMaxDepth, '}'), &whole), deep.size() + JsonPrefix::kMaxDepth);
  EXPECT_TRUE(whole);
  // An object at the last level: no ',' where only a property that cannot fit could follow (pydantic's
  // TreeNode one level down, as a tool's arguments are: objects at even depths).
  const auto tree = JsonSchema::compile(J::parse(R"({"type":"object","properties":{"t":{"$ref":"#/$defs/T"}},"required":["t"],
      "$defs":{"T":{"type":"object","properties":{"value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/T"}}},"required":["value"]}}})"));
  std::string levels = R"({"t":)";
  for (int i = 0; i < (JsonPrefix::kMaxDepth - 2) / 2; ++i) levels += R"({"value":1,"children":[)";
  levels += R"({"value":1)";  // an object at depth kMaxDepth
  EXPECT_EQ(accepted_by(*tree, levels + ","), levels.size());
  EXPECT_EQ(accepted_by(*tree, levels + "}"), levels.size() + 1);
  // A keyed union's branch whose required values cannot fit is not begun by its key: at depth 64
  // only the leaf's key ("kids" and "n" begin the branch that opens an array).
  const auto keyed = JsonSchema::compile(J::parse(schemas[std::size(schemas) - 1]));
  std::string at_limit = R"({"t":)";
  for (int i = 0; i < (JsonPrefix::kMaxDepth - 2) / 2; ++i) at_limit += R"({"kids":[)";
  at_limit += "{";  // depth 64
  EXPECT_EQ(accepted_by(*keyed, at_limit + "\"kids"), at_limit.size() + 1);
  EXPECT_EQ(accepted_by(*keyed, at_limit + "\"n"), at_limit.size() + 1);
  const std::string leaf = at_limit + "\"leaf\":1}";
  EXPECT_EQ(accepted_by(*keyed, leaf), leaf.size());
  // Exponents of two digits at most.
  const auto num = JsonSchema::compile(J::parse(R"({"type":"object","properties":{"x":{"type":"number"}},"required":["x"]})"));
  EXPECT_EQ(accepted_by(*num, R"({"x":1e99})"), std::string(R"({"x":1e99})").size());
  EXPECT_EQ(accepted_by(*num, R"({"x":-2.5E-12})"), std::string(R"({"x":-2.5E-12})").size());
  EXPECT_EQ(accepted_by(*num, R"({"x":21e505})"), std::string(R"({"x":21e50)").size());
}

// Dicts (additionalProperties: a schema, pydantic's Dict[str, X]) and string lengths (minLength /
// maxLength, in characters: an escape, a surrogate pair or a multi-byte UTF-8 character is one).
TEST(JsonSchema, DictValuesAndStringLengths) {
  const auto schema = JsonSchema::compile(J::parse(R"({"type":"object","properties":{
      "scores":{"type":"object","additionalProperties":{"type":"integer"}},
      "code":{"type":"string","minLength":2,"maxLength":4},
      "tags":{"type":"object","additionalProperties":{"type":"array","items":{"type":"string","maxLength":1}}}},
      "required":["scores","code"]})"));
  for (const std::string& doc : {std::string(R"({"scores":{"a":1,"b":-2},"code":"ab"})"),
                                std::string(R"({"scores":{},"code":"\u00e9\ud83d\ude00xy"})"),
                                std::string("{\"scores\":{},\"code\":\"\xc3\xa9\xf0\x9f\x98\x80xy\"}"),
                                std::string(R"({"scores":{"x y":0},"code":"\"\\","tags":{"t":["a","b"]}})")}) {
    bool whole = false;
    EXPECT_EQ(accepted_by(*schema, doc, &whole), doc.size()) << doc;
    EXPECT_TRUE(whole) << doc;
  }
  const std::pair<std::string, std::string> refused[] = {
      {R"({"scores":{"a":"1")", R"({"scores":{"a":)"},                   // a dict's values are integers
      {R"({"scores":{},"code":"a")", R"({"scores":{},"code":"a)"},          // minLength 2
      {R"({"scores":{},"code":"abcde")", R"({"scores":{},"code":"abcd)"},   // maxLength 4
      {"{\"scores\":{},\"code\":\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", "{\"scores\":{},\"code\":\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"},
      {R"({"scores":{},"code":"ab","tags":{"t":["ab")", R"({"scores":{},"code":"ab","tags":{"t":["a)"},
  };
  for (const auto& [text, ok_prefix] : refused) EXPECT_EQ(accepted_by(*schema, text), ok_prefix.size()) << text;
  for (const auto& [text, want] : std::vector<std::pair<const char*, const char*>>{
           {R"({"type":"object","properties":{"s":{"type":"string","minLength":3,"maxLength":2}}})", "'minLength' is above 'maxLength'"},
           {R"({"type":"object","properties":{"a":{}},"additionalProperties":{"type":"integer"}})", "'additionalProperties' beside 'properties'"},
           {R"({"type":"object","properties":{"s":{"type":"string","maxLength":-1}}})", "'maxLength' must be a non-negative integer"}}) {
    const std::string e = test::error_of([&] { JsonSchema::compile(J::parse(text)); });
    EXPECT_NE(e.find(want), std::string::npos) << text << ": " << e;
  }
}

TEST(JsonSchema, RefusesWhatItDoesNotSupportByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type":"object","properties":{"a":{"type":"integer","multipleOf":2}}})", "/properties/a: 'multipleOf' is not supported"},
      {R"({"type":"object","properties":{"a":{"type":"array","uniqueItems":true}}})", "/properties/a: 'uniqueItems' is not supported"},
      {R"({"type":"object","properties":{"a":{"type":"integer","minimum":5,"maximum":4.5}}})", "'minimum' / 'maximum' allow no number"},
      {R"({"type":"object","properties":{"a":{"type":"integer","minimum":"0"}}})", "'minimum' must be a number"},
      {R"({"type":"object","properties":{"a":{"anyOf":[{"type":"integer"},{"type":"null"}],"minimum":0}}})", "'minimum' beside 'anyOf'"},
      {R"({"type":"object","properties":{"a":{"anyOf":[{"type":"array"},{"type":"null"}],"maxItems":2}}})", "'maxItems' beside 'anyOf'"},
      {R"({"type":"object","properties":{"a":{"type":"array","prefixItems":[{},false],"minItems":2}}})", "allow at most 1 items, but 'minItems' is 2"},
      {R"({"type":"object","properties":{"a":{"type":"array","additionalItems":false}}})", "'additionalItems' without an 'items' list"},
      {R"({"type":"array"})", "the root must be an object schema"},
      {R"({"type":"object","properties":{"a":{"$ref":"#/$defs/Missing"}}})", "'#/$defs/Missing' names nothing"},
      {R"({"type":"object","properties":{"a":{"anyOf":[{"type":"string"},{"enum":["x"]}]}}})", "branches whose values can begin alike"},
      {R"({"type":"object","properties":{"a":{"enum":[[1],2]}}})", "'enum' / 'const' value [1] is not supported"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "'required' names \"b\""},
      {R"({"type":"object","properties":{"a":{"type":"date"}}})", "'type' \"date\" is not a JSON Schema type"},
      {R"({"type":"object","properties":{"a":{}},"additionalProperties":true})", "'additionalProperties' beside 'properties'"},
      {R"({"$ref":"#"})", "a cycle of '$ref's"},
  };
  for (const auto& [schema, want] : cases) {
    try {
      JsonSchema::compile(J::parse(schema));
      ADD_FAILURE() << schema << " compiled";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << schema << ": " << e.what();
    }
  }
  // A client's hostile schemas: a long $ref chain, many subschemas; errors, not a deep recursion.
  J chain = J::parse(R"({"type":"object","properties":{"a":{"$ref":"#/$defs/d0"}},"$defs":{}})");
  for (int i = 0; i < 300; ++i) chain["$defs"]["d" + std::to_string(i)] = J{{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  chain["$defs"]["d300"] = J{{"type", "string"}};
  EXPECT_NE(test::error_of([&] { JsonSchema::compile(chain); }).find("deeper than 128"), std::string::npos);
  J wide = J::parse(R"({"type":"object","properties":{}})");
  for (int i = 0; i < 64; ++i) {
    J inner = J::parse(R"({"type":"object","properties":{}})");
    for (int k = 0; k < 64; ++k) inner["properties"]["p" + std::to_string(k)] = J{{"type", "string"}};
    wide["properties"]["q" + std::to_string(i)] = inner;
  }
  EXPECT_NE(test::error_of([&] { JsonSchema::compile(wide); }).find("more than 4096 subschemas"), std::string::npos);
  // const, boolean enums, additionalProperties false on an empty object, nullable type lists.
  const auto s = JsonSchema::compile(J::parse(R"({"type":"object","properties":{"k":{"const":"v"},"b":{"enum":[true]},)"
                                              R"("e":{"type":"object","additionalProperties":false},"n":{"type":["integer","null"]}},)"
                                              R"("required":["k","b","e","n"]})"));
  bool whole = false;
  EXPECT_EQ(accepted_by(*s, R"({"k":"v","b":true,"e":{},"n":null})", &whole), 34u);
  EXPECT_TRUE(whole);
  EXPECT_EQ(accepted_by(*s, R"({"k":"v","b":false)"), 13u);
  EXPECT_EQ(accepted_by(*s, R"({"k":"v","b":true,"e":{"x")"), 23u);
}

// New-user trial 44's schemas: recursive Optionals (OpenAI's linked-list example, pydantic's
// Optional['Self']) keep the recursive node's required members; enum values and property names
// with quotes; surrogate escapes in pairs; schemas with no finite value refused; `false`
// subschemas; percent-encoded $refs.
TEST(JsonSchema, RecursiveOptionalsQuotesSurrogatesAndFalseSchemas) {
  const auto list = JsonSchema::compile(J::parse(R"({"type":"object","properties":{"linked_list":{"$ref":"#/$defs/n"}},
      "$defs":{"n":{"type":"object","properties":{"value":{"type":"number"},"next":{"anyOf":[{"$ref":"#/$defs/n"},{"type":"null"}]}},
      "required":["next","value"]}},"required":["linked_list"]})"));
  bool whole = false;
  const std::string ok = R"({"linked_list":{"value":30,"next":{"value":1,"next":null}}})";
  EXPECT_EQ(accepted_by(*list, ok, &whole), ok.size());
  EXPECT_TRUE(whole);
  EXPECT_EQ(accepted_by(*list, R"({"linked_list":{"value":30,"next":{"value":30}})"),
            std::string(R"({"linked_list":{"value":30,"next":{"value":30)").size());  // the inner node needs "next"
  const auto self = JsonSchema::compile(J::parse(R"({"type":"object","properties":{"child":{"anyOf":[{"$ref":"#"},{"type":"null"}]}},"required":["child"]})"));
  EXPECT_EQ(accepted_by(*self, R"({"child":{}})"), 10u);
  EXPECT_EQ(accepted_by(*self, R"({"child":{"child":null}})", &whole), 24u);
  EXPECT_TRUE(whole);

  const auto quotes = JsonSchema::compile(J::parse(R"({"type":"object","properties":{"a\"b":{"enum":["q\"uote","back\\slash","\u00e9"]}},"required":["a\"b"]})"));
  for (const std::string& doc : {std::string(R"({"a\"b":"q\"uote"})"), std::string(R"({"a\"b":"back\\slash"})"),
                                std::string("{\"a\\\"b\":\"\xc3\xa9\"}")}) {
    EXPECT_EQ(accepted_by(*quotes, doc, &whole), doc.size()) << doc;
    EXPECT_TRUE(whole) << doc;
  }
  EXPECT_EQ(accepted_by(*quotes, R"({"a\"b":"q")"), 10u);  // "q" is no value of the enum

  const auto any = JsonSchema::any_object();
  EXPECT_EQ(accepted_by(*any, R"({"s":"\ud83d\ude00"})", &whole), 20u);
  EXPECT_TRUE(whole);
  EXPECT_EQ(accepted_by(*any, R"({"s":"\ud800"})"), 12u);        // a high surrogate alone
  EXPECT_EQ(accepted_by(*any, R"({"s":"\ud800\u0041"})"), 17u);  // not followed by a low one
  EXPECT_EQ(accepted_by(*any, R"({"s":"\ude00"})"), 11u);        // a low surrogate alone

  EXPECT_NE(test::error_of([] { JsonSchema::compile(J::parse(R"({"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]})")); })
                .find("allows no finite value"),
            std::string::npos);
  const auto falses = JsonSchema::compile(J::parse(R"({"type":"object","properties":{"gone":false,"none":{"type":"array","items":false},
      "x y":{"$ref":"#/$defs/a%20b"}},"required":["none"],"$defs":{"a b":{"type":"integer"}}})"));
  EXPECT_EQ(accepted_by(*falses, R"({"none":[],"x y":3})", &whole), 19u);
  EXPECT_TRUE(whole);
  EXPECT_EQ(accepted_by(*falses, R"({"gone":1})"), 2u);  // no key "g..."
  EXPECT_EQ(accepted_by(*falses, R"({"none":[1])"), 9u);
}

// Untagged unions of objects with different first keys (pydantic's Union[Answer, Question] of
// models with different fields): the first key written picks the branch, the rest of the object
// follows it; {} only when a branch takes it; recursion through such a union is refused.
TEST(JsonSchema, UnionsOfObjectsToldApartByTheirFirstKey) {
  const auto schema = JsonSchema::compile(J::parse(R"({"type":"object","properties":{"r":{"anyOf":[
      {"$ref":"#/$defs/Answer"},{"$ref":"#/$defs/Question"},{"type":"null"}]},
      "e":{"anyOf":[{"type":"object","properties":{"x":{"type":"integer"}}},{"type":"object","properties":{"y":{"type":"string"}},"required":["y"]}]}},
      "required":["r"],
      "$defs":{"Answer":{"type":"object","properties":{"text":{"type":"string"},"score":{"type":"number"}},"required":["text","score"]},
               "Question":{"type":"object","properties":{"lang":{"enum":["en","fr"]},"ask":{"type":"string"},"urgent":{"type":"boolean"}},"required":["ask"]}}})"));
  for (const std::string& doc : {std::string(R"({"r":{"text":"hi","score":0.5}})"), std::string(R"({"r":{"ask":"why?"}})"),
                                std::string(R"({"r":{"lang":"fr","ask":"pourquoi ?","urgent":true}})"), std::string(R"({"r":null,"e":{}})"),
                                std::string(R"({"r":null,"e":{"x":1}})"), std::string(R"({"r":null,"e":{"y":"s"}})")}) {
    bool whole = false;
    EXPECT_EQ(accepted_by(*schema, doc, &whole), doc.size()) << doc;
    EXPECT_TRUE(whole) << doc;
  }
  const std::pair<std::string, std::string> refused[] = {
      {R"({"r":{})", R"({"r":{)"},                                  // both branches require a key
      {R"({"r":{"score":1)", R"({"r":{")"},                           // Answer's first key is "text"
      {R"({"r":{"text":"a","ask")", R"({"r":{"text":"a",")"},          // an Answer goes on as one
      {R"({"r":{"text":"a"})", R"({"r":{"text":"a")"},                // its score is required
      {R"({"r":{"lang":"en","text")", R"({"r":{"lang":"en",")"},      // a Question's
      {R"({"r":{"lang":"en"})", R"({"r":{"lang":"en")"},              // its ask is required
      {R"({"r":null,"e":{"x":1,"y")", R"({"r":null,"e":{"x":1)"},
  };
  for (const auto& [text, ok_prefix] : refused) EXPECT_EQ(accepted_by(*schema, text), ok_prefix.size()) << text;
  // recursion below the union's branches is fine
  EXPECT_NO_THROW(JsonSchema::compile(J::parse(R"({"type":"object","properties":{"t":{"$ref":"#/$defs/T"}},"$defs":{"T":{"anyOf":[
        {"type":"object","properties":{"leaf":{"type":"integer"}},"required":["leaf"]},
        {"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#/$defs/T"}}},"required":["kids"]}]}}})")));
  // Recursion through the union itself (trial 50: pydantic's Union[Node, Leaf] with Node's children
  // of the same union was refused): made once the whole schema is compiled.
  const auto tree = JsonSchema::compile(J::parse(R"({"$defs":{"Leaf":{"properties":{"value":{"type":"integer"}},"required":["value"],"type":"object"},
      "Node":{"properties":{"children":{"items":{"anyOf":[{"$ref":"#/$defs/Node"},{"$ref":"#/$defs/Leaf"}]},"type":"array"}},"required":["children"],"type":"object"}},
      "properties":{"tree":{"anyOf":[{"$ref":"#/$defs/Node"},{"$ref":"#/$defs/Leaf"}]}},"required":["tree"],"type":"object"})"));
  const std::string tdoc = R"({"tree":{"children":[{"value":1},{"children":[{"value":2}]},{"children":[]}]}})";
  bool twhole = false;
  EXPECT_EQ(accepted_by(*tree, tdoc, &twhole), tdoc.size());
  EXPECT_TRUE(twhole);
  EXPECT_EQ(accepted_by(*tree, R"({"tree":{"children":[{"value":1,"children")"), std::string(R"({"tree":{"children":[{"value":1)").size());
  const auto self = JsonSchema::compile(J::parse(R"({"type":"object","properties":{"t":{"$ref":"#/$defs/T"}},"$defs":{"T":{"type":"object","properties":{
      "u":{"anyOf":[{"$ref":"#/$defs/T"},{"type":"object","properties":{"z":{"type":"integer"}},"required":["z"]}]}}}}})"));
  const std::string sdoc = R"({"t":{"u":{"u":{"z":1}}}})";
  EXPECT_EQ(accepted_by(*self, sdoc, &twhole), sdoc.size());
  EXPECT_TRUE(twhole);
  // oneOf: an object of one branch must be of no other under JSON Schema's open objects (trial 50).
  for (const auto& [schema, ok] : std::vector<std::pair<const char*, bool>>{
           {R"([{"type":"object","properties":{"x":{}}},{"type":"object","properties":{"y":{}}}])", false},
           {R"([{"type":"object","properties":{"x":{}},"required":["x"]},{"type":"object","properties":{"y":{}}}])", false},
           {R"([{"type":"object","properties":{"x":{},"y":{}},"required":["x"]},{"type":"object","properties":{"y":{}},"required":["y"]}])", false},
           {R"([{"type":"object","properties":{"x":{}},"required":["x"]},{"type":"object","properties":{"y":{}},"required":["y"]}])", true},
           {R"([{"type":"object","properties":{"x":{}},"required":["x"],"additionalProperties":false},
                {"type":"object","properties":{"y":{}},"additionalProperties":false}])", true}}) {
    J s = J::parse(R"({"type":"object","properties":{"p":{}}})");
    s["properties"]["p"]["oneOf"] = J::parse(schema);
    const std::string e = test::error_of([&] { JsonSchema::compile(s); });
    EXPECT_EQ(e.find("may also be one of branch") == std::string::npos, ok) << schema << ": " << e;
    s["properties"]["p"]["anyOf"] = s["properties"]["p"]["oneOf"];
    s["properties"]["p"].erase("oneOf");
    EXPECT_NO_THROW(JsonSchema::compile(s)) << schema;
  }
  // A branch that is itself a union of objects is named so (it was "not an object with properties").
  EXPECT_NE(test::error_of([&] {
              JsonSchema::compile(J::parse(R"({"type":"object","properties":{"p":{"anyOf":[{"anyOf":[
                  {"type":"object","properties":{"a":{}},"required":["a"]},{"type":"object","properties":{"b":{}},"required":["b"]}]},
                  {"type":"object","properties":{"c":{}},"required":["c"]}]}}})"));
            }).find("branch 0 is itself a union of objects"),
            std::string::npos);
}

// Numeric bounds (pydantic's Field(ge=, le=, gt=, lt=)): a number is begun, and goes on, only while
// some value it can still become is in range, and ends only in range; the decimal text is compared
// exactly with the bound's shortest text (0.3 is the bound 0.3); no exponent. Numeric enums
// (IntEnum, Literal[1, 2]) and tuples (prefixItems, draft 7's items list).
TEST(JsonSchema, NumberBoundsNumericEnumsAndTuples) {
  const auto schema = JsonSchema::compile(J::parse(R"({"type":"object","properties":{
      "age":{"type":"integer","minimum":1,"maximum":120},
      "p":{"type":"number","exclusiveMinimum":0,"maximum":0.3},
      "t":{"type":"integer","minimum":-5,"exclusiveMaximum":-1.5},
      "e":{"type":"number","enum":[1,2,10,2.5]},
      "i":{"type":"integer","enum":[1.0,3,2.5]},
      "m":{"enum":[1,"a",null]},
      "pt":{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"minItems":2,"maxItems":2},
      "d7":{"type":"array","items":[{"type":"integer"}],"additionalItems":{"type":"string"}},
      "old":{"type":"number","minimum":10,"exclusiveMinimum":true},
      "u":{"type":"number","minimum":0.5,"exclusiveMaximum":1},
      "g":{"type":"number","exclusiveMinimum":1e15,"maximum":1000000000000002}}})"));
  for (const std::string& doc : {std::string(R"({"age":1})"), std::string(R"({"age":120})"), std::string(R"({"age":99,"p":0.3})"),
                                std::string(R"({"p":0.000001})"), std::string(R"({"p":0.29999999999999999})"), std::string(R"({"p":0.30000})"),
                                std::string(R"({"t":-2})"), std::string(R"({"t":-5})"), std::string(R"({"e":10})"), std::string(R"({"e":2.5})"),
                                std::string(R"({"e":1,"i":1})"), std::string(R"({"i":3,"m":"a"})"), std::string(R"({"m":1})"),
                                std::string(R"({"m":null})"), std::string(R"({"pt":[1,"a"]})"), std::string(R"({"d7":[1,"a","b"]})"),
                                std::string(R"({"d7":[]})"), std::string(R"({"old":10.5})"), std::string(R"({"u":0.9999999999999999})"),
                                std::string(R"({"g":1000000000000000.1})")}) {
    bool whole = false;
    EXPECT_EQ(accepted_by(*schema, doc, &whole), doc.size()) << doc;
    EXPECT_TRUE(whole) << doc;
  }
  const std::pair<std::string, std::string> refused[] = {
      {R"({"age":0)", R"({"age":)"},  // no integer in range begins with 0
      {R"({"age":-1)", R"({"age":)"},
      {R"({"age":121)", R"({"age":12)"},
      {R"({"age":1200)", R"({"age":120)"},
      {R"({"age":1.0)", R"({"age":1)"},  // an integer
      {R"({"p":0})", R"({"p":0)"},       // exclusive: 0 is out, 0.x in
      {R"({"p":0.0})", R"({"p":0.0)"},
      {R"({"p":0.31)", R"({"p":0.3)"},
      {R"({"p":0.30000000000000001)", R"({"p":0.3000000000000000)"},
      {R"({"p":1)", R"({"p":)"},
      {R"({"p":0.2e-1)", R"({"p":0.2)"},  // no exponent
      {R"({"p":0.1234567890123456789)", R"({"p":0.123456789012345678)"},  // 18 fraction digits
      {R"({"t":-1)", R"({"t":-)"},       // -1.5 exclusive: an integer up to -2
      {R"({"t":-6)", R"({"t":-)"},
      {R"({"t":-10)", R"({"t":-)"},
      {R"({"t":3)", R"({"t":)"},
      {R"({"e":3)", R"({"e":)"},
      {R"({"e":2.55)", R"({"e":2.5)"},
      {R"({"e":1.0)", R"({"e":1)"},
      {R"({"i":2)", R"({"i":)"},         // 2.5 is no integer
      {R"({"i":1.0)", R"({"i":1)"},
      {R"({"m":2)", R"({"m":)"},
      {R"({"m":"b")", R"({"m":")"},
      {R"({"pt":["a")", R"({"pt":[)"},
      {R"({"pt":[1])", R"({"pt":[1)"},
      {R"({"pt":[1,"a",)", R"({"pt":[1,"a")"},
      {R"({"d7":[1,2)", R"({"d7":[1,)"},
      {R"({"old":10})", R"({"old":10)"},
      // Exclusive bounds (trial 49): a decimal just past the bound that reads back as the bound
      {R"({"u":0.99999999999999999)", R"({"u":0.9999999999999999)"},
      {R"({"g":1000000000000000.0000000000000001)", R"({"g":1000000000000000.)"},
      {R"({"old":10.0000000000000001)", R"({"old":10.00000000000000)"},
  };
  for (const auto& [text, ok_prefix] : refused) EXPECT_EQ(accepted_by(*schema, text), ok_prefix.size()) << text;

  // Random walks that prefer digits never reach a dead end, and every number they end lies in range
  // as a double (what a client's parser reads).
  const char* bounded[] = {
      R"({"type":"integer","minimum":-37,"maximum":1205})",
      R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})",
      R"({"type":"number","minimum":-0.5,"maximum":0.25})",
      R"({"type":"integer","minimum":1e3})",
      R"({"type":"number","minimum":123456.789})",
      R"({"type":"number","maximum":-1e-7})",
      R"({"type":"integer","minimum":7,"maximum":7})",
      R"({"type":"number","minimum":0.1,"maximum":0.1})",
      R"({"type":"integer","minimum":-9007199254740993,"maximum":-9007199254740991})",
      R"({"type":"number","exclusiveMinimum":0.1,"exclusiveMaximum":0.3})",
      R"({"type":"number","exclusiveMinimum":1e15,"exclusiveMaximum":1000000000000002})",
      R"({"type":"number","minimum":1e300})",  // beyond 16 digits: no number fits
  };
  std::mt19937 rng(3);
  for (const char* b : bounded) {
    const J bj = J::parse(b);
    J s = J::parse(R"({"type":"object","properties":{"x":{}},"required":["x"]})");
    s["properties"]["x"] = bj;
    if (std::string(b).find("1e300") != std::string::npos) {
      EXPECT_NE(test::error_of([&] { JsonSchema::compile(s); }).find("allow no number"), std::string::npos);
      continue;
    }
    const auto sc = JsonSchema::compile(s);
    for (int walk = 0; walk < 300; ++walk) {
      JsonPrefix p(*sc);
      std::string out;
      ASSERT_TRUE(p.feed(std::string_view(R"({"x":)")));
      out = R"({"x":)";
      while (!p.complete()) {
        std::string order = "0123456789-.";
        std::shuffle(order.begin(), order.end(), rng);
        order += rng() % 3 == 0 ? "}" : "";
        std::shuffle(order.begin(), order.end(), rng);
        order += "}eE+";
        const bool moved = feed_first(p, order, out);
        ASSERT_TRUE(moved) << b << ": no byte continues " << out;
      }
      const J v = J::parse(out)["x"];
      if (bj.contains("minimum")) {
        EXPECT_GE(v.get<double>(), bj["minimum"].get<double>()) << b << " " << out;
      }
      if (bj.contains("maximum")) {
        EXPECT_LE(v.get<double>(), bj["maximum"].get<double>()) << b << " " << out;
      }
      if (bj.contains("exclusiveMinimum")) {
        EXPECT_GT(v.get<double>(), bj["exclusiveMinimum"].get<double>()) << b << " " << out;
      }
      if (bj.contains("exclusiveMaximum")) {
        EXPECT_LT(v.get<double>(), bj["exclusiveMaximum"].get<double>()) << b << " " << out;
      }
      if (bj["type"] == "integer") {
        EXPECT_TRUE(v.is_number_integer()) << out;
      }
    }
  }
}

// `pattern` (an ECMA regex, searched as JSON Schema's: unanchored ends match anything) and the
// formats given as patterns: a character is taken only while the pattern can still match (UTF-8 bytes
// by the range of characters they can still become, escapes by what they stand for), the string
// ends only on a match; together with minLength / maxLength no dead end.
TEST(JsonSchema, PatternsAndFormats) {
  const auto schema = JsonSchema::compile(J::parse(R"({"type":"object","properties":{
      "phone":{"type":"string","pattern":"^\\d{3}-\\d{4}$"},
      "code":{"type":"string","pattern":"^[A-Z]{2}(-[a-z]+)?$"},
      "has":{"type":"string","pattern":"ab+c"},
      "alt":{"type":"string","pattern":"^x$|^(?:y|é)z*$"},
      "esc":{"type":"string","pattern":"^[\\n\\\\\"]\\.?$"},
      "day":{"type":"string","format":"date"},
      "at":{"type":"string","format":"date-time"},
      "id":{"type":"string","format":"uuid"},
      "ip":{"type":"string","format":"ipv4"},
      "lim":{"type":"string","pattern":"^a*b*$","minLength":2,"maxLength":3},
      "wild":{"type":"string","format":"hostname"},
      "mail":{"type":"string","format":"email"},
      "hex":{"type":"string","pattern":"^[\\x41-\\x4d]+$"}}})"));
  for (const std::string& doc : {
           std::string(R"({"phone":"555-1234"})"), std::string(R"({"code":"US"})"), std::string(R"({"code":"EN-gb"})"),
           std::string(R"({"has":"xxabbbcyy"})"), std::string(R"({"has":"abc"})"), std::string(R"({"alt":"x"})"),
           std::string("{\"alt\":\"\xc3\xa9zz\"}"), std::string(R"({"alt":"y"})"), std::string(R"({"esc":"\n."})"),
           std::string(R"({"esc":"\\"})"), std::string(R"({"esc":"\""})"), std::string(R"({"day":"2024-02-29"})"),
           std::string(R"({"at":"2024-02-29T23:59:59.123+05:30"})"), std::string(R"({"at":"1999-12-31t00:00:00Z"})"),
           std::string(R"({"id":"123e4567-e89b-12d3-a456-426614174000"})"), std::string(R"({"ip":"255.0.10.199"})"),
           std::string(R"({"lim":"ab"})"), std::string(R"({"lim":"bbb"})"), std::string(R"({"wild":"anything at all"})"),
           std::string(R"({"day":"2000-02-29"})"), std::string(R"({"day":"0004-02-29"})"), std::string(R"({"day":"2023-12-31"})"),
           std::string(R"({"mail":"john.doe+x@mail.example.com"})"), std::string(R"({"hex":"AM"})")}) {
    bool whole = false;
    EXPECT_EQ(accepted_by(*schema, doc, &whole), doc.size()) << doc;
    EXPECT_TRUE(whole) << doc;
  }
  const std::pair<std::string, std::string> refused[] = {
      {R"({"phone":"55-)", R"({"phone":"55)"},
      {R"({"phone":"555-12345)", R"({"phone":"555-1234)"},
      {R"({"phone":"555-123")", R"({"phone":"555-123)"},  // ends only on a match
      {R"({"phone":"\n)", R"({"phone":")"},             // no escape stands for a digit
      {R"({"has":"\u0061)", R"({"has":"\)"},            // no \u escapes in a pattern's string
      {R"({"code":"us)", R"({"code":")"},
      {R"({"code":"US-)", R"({"code":"US-)"},           // "US-" may go on, but not end
      {R"({"code":"US-")", R"({"code":"US-)"},
      {R"({"has":"ab")", R"({"has":"ab)"},
      {R"({"alt":"xz)", R"({"alt":"x)"},
      {"{\"alt\":\"\xc3\xa8", "{\"alt\":\"\xc3"},  // è: the lead byte may still become é, the next byte not
      {"{\"alt\":\"\xe2", "{\"alt\":\""},            // no 3-byte character fits
      {R"({"esc":"\t)", R"({"esc":"\)"},                  // \t stands for a tab: not in the class
      {R"({"esc":"a)", R"({"esc":")"},
      {R"({"day":"2024-13)", R"({"day":"2024-1)"},
      {R"({"day":"2024-02-32)", R"({"day":"2024-02-)"},           // February has no 3x
      {R"({"day":"2023-02-29)", R"({"day":"2023-02-2)"},          // nor a 29th in 2023
      {R"({"day":"1900-02-29)", R"({"day":"1900-02-2)"},
      {R"({"day":"0000)", R"({"day":"000)"},                      // years 0001-9999
      {R"({"day":"2024-04-31)", R"({"day":"2024-04-3)"},
      {R"({"at":"2024-02-29T23:59:60)", R"({"at":"2024-02-29T23:59:)"},  // no leap second (Python's datetime)
      {R"({"at":"2024-02-29T24)", R"({"at":"2024-02-29T2)"},
      {R"({"at":"2024-02-29T23:59:59")", R"({"at":"2024-02-29T23:59:59)"},  // an offset is required
      {R"({"id":"123e4567-e89b-12d3-a456-42661417400g)", R"({"id":"123e4567-e89b-12d3-a456-42661417400)"},
      {R"({"ip":"256)", R"({"ip":"25)"},
      {R"({"lim":"a")", R"({"lim":"a)"},                  // minLength 2
      {R"({"lim":"aaaa)", R"({"lim":"aaa)"},              // maxLength 3
      {R"({"lim":"aba)", R"({"lim":"ab)"},
      {R"({"mail":"a..b)", R"({"mail":"a.)"},
      {R"({"mail":"a@b")", R"({"mail":"a@b)"},                  // a domain with a dot
      {R"({"hex":"AN)", R"({"hex":"A)"},                        // [\x41-\x4d] ends at M
  };
  for (const auto& [text, ok_prefix] : refused) EXPECT_EQ(accepted_by(*schema, text), ok_prefix.size()) << text;

  // Random walks over bytes (ASCII, multi-byte characters, escapes) never reach a dead end, and each
  // string they end matches the pattern (std::regex's ECMAScript grammar as the oracle, on ASCII).
  const char* patterns[] = {R"(^\d{3}-\d{4}$)", R"(^[A-Z]{2}(-[a-z]+)?$)", R"(ab+c)", R"(^(a|bc)*d?$)", R"(^.{2,4}$)",
                            R"(^[^a-c\s]+x$)", R"(\.$)", R"(^(?:[01]\d|2[0-3]):[0-5]\d$)", R"(^a{0,3}b{2}$)"};
  std::mt19937 rng(9);
  for (const char* pat : patterns) {
    J s = J::parse(R"({"type":"object","properties":{"x":{"type":"string","maxLength":12}},"required":["x"]})");
    s["properties"]["x"]["pattern"] = pat;
    const auto sc = JsonSchema::compile(s);
    const std::regex oracle(pat, std::regex::ECMAScript);
    for (int walk = 0; walk < 200; ++walk) {
      JsonPrefix p(*sc);
      std::string out = R"({"x":")";
      ASSERT_TRUE(p.feed(std::string_view(out)));
      while (!p.complete()) {
        std::string order = "abcdxyzAZ019-.: \\n\"";
        std::shuffle(order.begin(), order.end(), rng);
        if (rng() % 4 == 0) order = "\"}" + order;
        order += "\xc3\xe2\x80\xa9\xbf}";
        const bool moved = feed_first(p, order, out);
        ASSERT_TRUE(moved) << pat << ": no byte continues " << out;
      }
      const std::string v = J::parse(out)["x"].get<std::string>();
      EXPECT_LE(v.size(), 36u);
      bool ascii = std::all_of(v.begin(), v.end(), [](char c) { return static_cast<uint8_t>(c) < 0x80; });
      if (ascii) {
        EXPECT_TRUE(std::regex_search(v, oracle)) << pat << " " << out;
      }
    }
  }
  for (const auto& [pat, want] : std::vector<std::pair<std::string, std::string>>{
           {"(a", "has a '(' without its ')'"}, {"a)", "has a ')' without its '('"}, {"(?=a)", "lookahead"}, {"\\1", "back-reference"},
           {"\\bx", "word boundary"}, {"a^b", "anchors are supported only at the ends"}, {"*a", "nothing to repeat"},
           {"a{3,2}", "n above m"}, {"a{2000}", "more than 1000 times"}, {"[a-", "without its ']'"}, {"[z-a]", "out of order"},
           {"(a{200}){2}", "more than 255 character positions"}, {"[^\\s\\S]", "matches no string"},
           {"\\p{L}", "Unicode property"}, {"^\\0$", "matches no string"}, {"((((){999}){999}){999}){999}", "repeats too much"},
           // trial 49: a lone surrogate is no character; ECMA's "nothing to repeat"; {,m}; flags; an open group
           {"^\\ud800$", "matches no string"}, {"^[\\ud800-\\udbff]$", "matches no string"},
           {"a**", "quantifier after a quantifier"}, {"^a{2}{3}$", "quantifier after a quantifier"}, {"a+*", "quantifier after a quantifier"},
           {"a?+", "quantifier after a quantifier"}, {"^a{,3}$", "write {0,m}"}, {"(?i)abc", "inline flag"}, {"^(a$", "'(' without its ')'"},
           {std::string(5000, 'a'), "longer than 4096 bytes"}}) {
    J s = J::parse(R"({"type":"object","properties":{"x":{"type":"string"}}})");
    s["properties"]["x"]["pattern"] = pat;
    const std::string e = test::error_of([&] { JsonSchema::compile(s); });
    EXPECT_NE(e.find(want), std::string::npos) << pat << ": " << e;
    EXPECT_NE(e.find("/properties/x: 'pattern'"), std::string::npos) << e;
  }
  EXPECT_NE(test::error_of([&] { JsonSchema::compile(J::parse(R"({"type":"object","properties":{"x":{"type":"string","pattern":"^abc$","maxLength":2}}})")); })
                .find("allow no string together"),
            std::string::npos);
  // A long pattern is named by its start only.
  J big = J::parse(R"({"type":"object","properties":{"x":{"type":"string"}}})");
  big["properties"]["x"]["pattern"] = std::string(5000, 'a');
  const std::string long_error = test::error_of([&] { JsonSchema::compile(big); });
  EXPECT_LT(long_error.size(), 400u) << long_error;
  EXPECT_NE(long_error.find("(the first 200 of 5000 bytes)"), std::string::npos) << long_error;
  // A pattern beside an enforced format: both would have to hold.
  EXPECT_NE(test::error_of([&] { JsonSchema::compile(J::parse(R"({"type":"object","properties":{"x":{"type":"string","pattern":"^x$","format":"email"}}})")); })
                .find("'pattern' beside the 'format' \"email\""),
            std::string::npos);
  // Enum strings that break the string's other keywords are dropped (trial 49: they were written).
  const auto en = JsonSchema::compile(J::parse(R"({"type":"object","properties":{"a":{"enum":["abc","x"],"pattern":"^x$"},
      "b":{"enum":["a","bb"],"minLength":2},"c":{"enum":["2024-01-01","nope"],"format":"date"}}})"));
  EXPECT_EQ(accepted_by(*en, R"({"a":"a)"), std::string(R"({"a":")").size());
  EXPECT_EQ(accepted_by(*en, R"({"a":"x","b":"a")"), std::string(R"({"a":"x","b":")").size());
  EXPECT_EQ(accepted_by(*en, R"({"a":"x","b":"bb","c":"n)"), std::string(R"({"a":"x","b":"bb","c":")").size());
  bool whole = false;
  EXPECT_EQ(accepted_by(*en, R"({"a":"x","b":"bb","c":"2024-01-01"})", &whole), std::string(R"({"a":"x","b":"bb","c":"2024-01-01"})").size());
  EXPECT_TRUE(whole);
  for (const char* none : {R"({"type":"object","properties":{"a":{"const":"abc","pattern":"^x$"}}})",
                           R"({"type":"object","properties":{"a":{"const":"abcdef","maxLength":2}}})"})
    EXPECT_NE(test::error_of([&] { JsonSchema::compile(J::parse(none)); }).find("allows no value"), std::string::npos) << none;
}

// Random patterns (a client's): each compiles or is refused with an error, and every string walk of
// a compiled one finds a byte that continues until it ends (no dead end: a NUL the string cannot
// hold, a length bound the pattern cannot meet). Under ASan / UBSan in CI.
// Counted repetitions are unrolled with their optional copies nested ((x(x)?)?): the same language
// as std::regex's on every string of up to 6 characters over the patterns' letters.
TEST(StringPattern, CountedRepetitionsMatchAsStdRegex) {
  const char* patterns[] = {"^a{2,5}$", "^(ab|c){1,3}d$", "^(a?){0,3}b$", "^(a|){2,4}$", "x{0,2}y", "^[a-c]{0,4}c$",
                            "^(a{1,2}b?){2,3}$", "a{3}", "^(?:ab?){0,2}$", "^b(a|ba){0,3}$"};
  const std::string letters = "abcdxy";
  for (const char* pat : patterns) {
    const StringPattern p = StringPattern::compile(pat, pat);
    const std::regex oracle(pat, std::regex::ECMAScript);
    int n = 0;
    for (size_t len = 0; len <= 6; ++len) {
      std::vector<size_t> idx(len, 0);
      for (bool more = true; more;) {
        std::string s;
        for (size_t i : idx) s += letters[i];
        EXPECT_EQ(p.matches(s), std::regex_search(s, oracle)) << pat << " on '" << s << "'";
        n += p.matches(s);
        more = false;
        for (size_t i = 0; i < len && !more; ++i) {
          if (++idx[i] < letters.size()) more = true;
          else idx[i] = 0;
        }
      }
    }
    EXPECT_GT(n, 0) << pat;
  }
}

TEST(JsonSchema, RandomPatternsCompileOrAreRefusedAndNeverDeadEnd) {
  std::mt19937 rng(1);
  const std::string alpha = "ab.*+?{}()[]^$|\\-,0123456789dDwWsSuxbBk<>=!:";
  int compiled = 0;
  for (int n = 0; n < 3000; ++n) {
    std::string pat;
    for (int i = static_cast<int>(rng() % 14); i > 0; --i) pat += alpha[rng() % alpha.size()];
    if (rng() % 4 == 0) pat += "\xc3\xa9";
    J s = J::parse(R"({"type":"object","properties":{"x":{"type":"string","maxLength":9}},"required":["x"]})");
    s["properties"]["x"]["pattern"] = pat;
    if (rng() % 3 == 0) s["properties"]["x"]["minLength"] = rng() % 4;
    std::shared_ptr<const JsonSchema> sc;
    try {
      sc = JsonSchema::compile(s);
    } catch (const Error&) {
      continue;
    }
    ++compiled;
    JsonPrefix p(*sc);
    ASSERT_TRUE(p.feed(std::string_view(R"({"x":")")));
    std::string out;
    while (!p.complete()) {
      bool moved = false;
      for (int t = 0; t < 64 && !moved; ++t) {
        const auto c = static_cast<uint8_t>(t % 5 == 0 ? '"' : alpha[rng() % alpha.size()]);
        if ((moved = p.feed(c))) out += static_cast<char>(c);
      }
      for (int c = 0; c < 256 && !moved; ++c)
        if ((moved = p.feed(static_cast<uint8_t>(c)))) out += static_cast<char>(c);
      ASSERT_TRUE(moved) << "pattern " << pat << ": no byte continues " << out;
      if (out.back() == '"') p.feed('}');  // (a '"' that closed the string: the object ends)
    }
  }
  EXPECT_GT(compiled, 1000);
}

// The byte-ordered walk (shared prefixes fed once, failing bytes skip their tokens) gives the mask
// of feeding every token alone, over a random vocabulary of JSON-ish pieces (many sharing prefixes,
// some prefixes of others) at the states of random documents' prefixes.
TEST(JsonSchema, TokenMaskWalkEqualsTokenByToken) {
  std::mt19937 rng(5);
  const std::string alphabet = "{}[],:\" \n0123456789.-eEtrufalsn abcAB\\\xc3\xa9\xe2\x82\xac";
  std::vector<std::string> vocab = {"", "{", "\"", "\"name", "\"name\"", "\"name\":", " \"", "\n", "\n  \"", "}"};
  while (vocab.size() < 3000) {
    std::string t;
    for (int k = static_cast<int>(1 + rng() % 7); k > 0; --k) t += alphabet[rng() % alphabet.size()];
    vocab.push_back(t);
    if (rng() % 3 == 0) vocab.push_back(t + alphabet[rng() % alphabet.size()]);
  }
  const JsonTokenMask mask(vocab);
  const auto schema = JsonSchema::compile(kPerson);
  const std::string doc = R"({"name":"A\u00e9b","age":-12,"height":1.5e3,"color":"green","tags":["x"],"pets":[{"name":"R","legs":4}],)"
                          R"("ok":true,"tree":{"v":1,"kids":[]},"extra":{"k":[null,"s"]}})";
  std::vector<uint8_t> a, b;
  for (const bool with_schema : {false, true}) {
    JsonPrefix p = with_schema ? JsonPrefix(*schema) : JsonPrefix();
    for (size_t i = 0; i <= doc.size(); ++i) {
      const int64_t na = mask.allowed(p, a), nb = mask.allowed_each(p, b);
      ASSERT_EQ(a, b) << "after " << doc.substr(0, i);
      ASSERT_EQ(na, nb);
      if (i < doc.size()) {
        ASSERT_TRUE(p.feed(static_cast<uint8_t>(doc[i]))) << doc.substr(0, i + 1);
      }
    }
  }
}

// Random bytes (biased towards JSON's) into the schema automaton: every byte it takes keeps the text
// a prefix it accepts, and a text it calls complete parses (no crash under ASan/UBSan).
TEST(JsonSchema, RandomBytesNeverLeaveWhatItAccepts) {
  const auto schema = JsonSchema::compile(kPerson);
  std::mt19937 rng(11);
  const std::string alphabet = "{}[],:\"\\ \n\t0123456789.-+eEtruefalsnl abcxyzATG\xc3\xa9\xf0\x9f\x99\x82\x01";
  for (int n = 0; n < 3000; ++n) {
    JsonPrefix p(*schema);
    std::string text;
    for (int i = 0; i < 400 && !p.complete(); ++i) {
      const auto c = static_cast<uint8_t>(rng() % 8 == 0 ? rng() % 256 : alphabet[rng() % alphabet.size()]);
      if (p.feed(c)) text += static_cast<char>(c);
    }
    if (p.complete()) {
      EXPECT_TRUE(J::accept(text)) << text;
    }
    JsonPrefix replay(*schema);
    EXPECT_TRUE(replay.feed(text)) << text;
  }
}

}  // namespace
}  // namespace mk
