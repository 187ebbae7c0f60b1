// Symbolic dimensions: affine expressions c + a*n_tokens + b*n_past over the runtime symbols.
// n_tokens = tokens in this step (prompt length in prefill, 1 in decode); n_past = tokens already
// in the KV cache. One Graph/Program serves every position; symbols are bound per step.
#pragma once
#include <cstdint>
#include <string>

namespace mk {

struct SymValues {
  int64_t n_tokens = 1;
  int64_t n_past = 0;
};

struct SymExpr {
  int64_t c = 0;
  int64_t n_tokens = 0;  // coefficient of n_tokens
  int64_t n_past = 0;    // coefficient of n_past

  static SymExpr constant(int64_t v) { return {v, 0, 0}; }
  static SymExpr tokens() { return {0, 1, 0}; }
  static SymExpr past() { return {0, 0, 1}; }
  bool is_const() const { return n_tokens == 0 && n_past == 0; }
  int64_t eval(const SymValues& s) const { return c + n_tokens * s.n_tokens + n_past * s.n_past; }
  SymExpr operator+(const SymExpr& o) const { return {c + o.c, n_tokens + o.n_tokens, n_past + o.n_past}; }
  SymExpr operator*(int64_t k) const { return {c * k, n_tokens * k, n_past * k}; }
  bool operator==(const SymExpr&) const = default;
  // "64", "n_tokens", "n_past + n_tokens", "2*n_tokens + 1"
  std::string str() const;
  // Parses the str() form; throws mk::Error on anything else.
  static SymExpr parse(const std::string& text);
};

}  // namespace mk
