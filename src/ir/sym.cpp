#include "ir/sym.h"

#include <cctype>

#include "support/error.h"

namespace mk {

std::string SymExpr::str() const {
  std::string s;
  auto term = [&](int64_t k, const char* name) {
    if (k == 0) return;
    if (!s.empty()) s += k < 0 ? " - " : " + ";
    else if (k < 0) s += "-";
    int64_t a = k < 0 ? -k : k;
    if (a != 1) s += std::to_string(a) + "*";
    s += name;
  };
  term(n_out, "n_out");
  term(n_tokens, "n_tokens");
  if (c != 0 || s.empty()) {
    if (s.empty()) s = std::to_string(c);
    else s += (c < 0 ? " - " : " + ") + std::to_string(c < 0 ? -c : c);
  }
  return s;
}

SymExpr SymExpr::parse(const std::string& text) {
  SymExpr e;
  size_t i = 0;
  auto skip_ws = [&] { while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i; };
  int sign = 1;
  bool any = false;
  skip_ws();
  if (i < text.size() && text[i] == '-') { sign = -1; ++i; }
  while (true) {
    skip_ws();
    int64_t k = 1;
    bool have_num = false;
    if (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      size_t j = i;
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      k = std::stoll(text.substr(i, j - i));
      i = j;
      have_num = true;
    }
    skip_ws();
    if (have_num && (i >= text.size() || text[i] != '*')) {
      e.c += sign * k;
    } else {
      if (have_num) ++i;  // '*'
      skip_ws();
      size_t j = i;
      while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_')) ++j;
      std::string name = text.substr(i, j - i);
      i = j;
      if (name == "n_tokens") e.n_tokens += sign * k;
      else if (name == "n_out") e.n_out += sign * k;
      else fail("bad symbolic dimension '{}': unknown symbol '{}'", text, name);
    }
    any = true;
    skip_ws();
    if (i >= text.size()) break;
    if (text[i] == '+') sign = 1;
    else if (text[i] == '-') sign = -1;
    else fail("bad symbolic dimension '{}'", text);
    ++i;
  }
  if (!any) fail("empty symbolic dimension");
  return e;
}

}  // namespace mk
