// Parses the text form printed by Graph::str().
#include <cctype>
#include <charconv>

#include "ir/graph.h"
#include "support/error.h"

namespace mk {

namespace {

struct Lexer {
  std::string_view s;
  size_t i = 0;
  int line_no = 0;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  [[noreturn]] void error(const std::string& what) const {
    fail("IR parse error at line {}: {} in '{}'", line_no, what, std::string(s));
  }
  void expect(char c) {
    if (!eat(c)) error(fmt::format("expected '{}'", c));
  }
  std::string ident() {
    ws();
    size_t j = i;
    while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_' || s[j] == '.')) ++j;
    if (j == i) error("expected an identifier");
    std::string r(s.substr(i, j - i));
    i = j;
    return r;
  }
  int64_t integer() {
    ws();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data() + i, s.data() + s.size(), v);
    if (ec != std::errc()) error("expected an integer");
    i = static_cast<size_t>(p - s.data());
    return v;
  }
  std::string quoted() {
    expect('"');
    size_t j = s.find('"', i);
    if (j == std::string_view::npos) error("unterminated string");
    std::string r(s.substr(i, j - i));
    i = j + 1;
    return r;
  }
  AttrValue attr_value() {
    ws();
    if (i < s.size() && s[i] == '"') return quoted();
    size_t j = i;
    while (j < s.size() && s[j] != ',' && s[j] != '}' && s[j] != ' ') ++j;
    std::string tok(s.substr(i, j - i));
    i = j;
    if (tok.empty()) error("expected an attribute value");
    bool is_float = tok.find_first_of(".eEn") != std::string::npos;
    try {
      size_t used = 0;
      if (is_float) {
        double d = std::stod(tok, &used);
        if (used != tok.size()) error("bad number " + tok);
        return d;
      }
      int64_t v = std::stoll(tok, &used);
      if (used != tok.size()) error("bad number " + tok);
      return v;
    } catch (const std::logic_error&) {
      error("bad attribute value " + tok);
    }
  }
};

}  // namespace

Graph parse_graph(std::string_view text) {
  Graph g;
  size_t pos = 0;
  int line_no = 0;
  bool in_graph = false, done = false;
  while (pos <= text.size() && !done) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    size_t c = line.find("//");
    if (c != std::string_view::npos) line = line.substr(0, c);
    Lexer lx{line, 0, line_no};
    lx.ws();
    if (lx.i >= line.size()) continue;
    if (!in_graph) {
      if (lx.ident() != "graph") lx.error("expected 'graph {'");
      lx.expect('{');
      in_graph = true;
      continue;
    }
    if (lx.eat('}')) {
      done = true;
      continue;
    }
    if (line.substr(lx.i).starts_with("output")) {
      lx.ident();
      lx.expect('%');
      int v = static_cast<int>(lx.integer());
      g.add_output(v, lx.quoted());
      continue;
    }
    lx.expect('%');
    Node n;
    n.id = static_cast<int>(lx.integer());
    if (n.id != g.size()) lx.error(fmt::format("expected value %{}", g.size()));
    lx.expect('=');
    n.op = op_from_name(lx.ident());
    if (n.op == Op::weight) {
      lx.expect('@');
      n.weight = lx.ident();
    }
    lx.ws();
    while (lx.eat('%')) {
      n.inputs.push_back(static_cast<int>(lx.integer()));
      if (!lx.eat(',')) break;
    }
    if (lx.eat('{')) {
      while (!lx.eat('}')) {
        std::string k = lx.ident();
        lx.expect('=');
        n.attrs[k] = lx.attr_value();
        lx.eat(',');
      }
    }
    lx.expect(':');
    std::string dt = lx.ident();
    bool found = false;
    for (DType t : kAllDTypes)
      if (dtype_name(t) == dt) {
        n.dtype = t;
        found = true;
      }
    if (!found) lx.error("unknown dtype " + dt);
    lx.expect('[');
    while (!lx.eat(']')) {
      lx.ws();
      size_t j = lx.i;
      while (j < line.size() && line[j] != ',' && line[j] != ']') ++j;
      n.shape.push_back(SymExpr::parse(std::string(line.substr(lx.i, j - lx.i))));
      lx.i = j;
      lx.eat(',');
    }
    lx.ws();
    if (lx.i < line.size() && line[lx.i] == '"') n.name = lx.quoted();
    lx.ws();
    if (lx.i != line.size()) lx.error("unexpected trailing text");
    Node inferred = n;
    infer_node(g, inferred);
    if (inferred.shape != n.shape || inferred.dtype != n.dtype)
      lx.error("declared type does not match the type inferred from the inputs");
    g.nodes.push_back(std::move(n));
  }
  if (!done) fail("IR parse error: missing closing '}}'");
  return g;
}

}  // namespace mk
