// Symbolic dimensions: affine expressions c + a*n_tokens + b*n_out over the runtime symbols.
// n_tokens = rows in this step (all sequences of a ragged batch: prefill chunks and decode rows);
// n_out = rows whose logits the step returns (1 <= n_out <= n_tokens; 1 for one sequence). Where a
// row's K/V goes and what it attends to are per-row step inputs (positions, KV slots, block
// tables: backend/step_batch.h), not symbols. One Graph/Program serves every step; symbols are
// bound per step.
#pragma once
#include <cstdint>
#include <string>

namespace mk {

struct SymValues {
  int64_t n_tokens = 1;
  int64_t n_out = 1;
};

struct SymExpr {
  int64_t c = 0;
  int64_t n_tokens = 0;  // coefficient of n_tokens
  int64_t n_out = 0;     // coefficient of n_out

  static SymExpr constant(int64_t v) { return {v, 0, 0}; }
  static SymExpr tokens() { return {0, 1, 0}; }
  static SymExpr out() { return {0, 0, 1}; }
  bool is_const() const { return n_tokens == 0 && n_out == 0; }
  int64_t eval(const SymValues& s) const { return c + n_tokens * s.n_tokens + n_out * s.n_out; }
  SymExpr operator+(const SymExpr& o) const { return {c + o.c, n_tokens + o.n_tokens, n_out + o.n_out}; }
  SymExpr operator*(int64_t k) const { return {c * k, n_tokens * k, n_out * k}; }
  bool operator==(const SymExpr&) const = default;
  // "64", "n_tokens", "n_out + n_tokens", "2*n_tokens + 1"
  std::string str() const;
  // Parses the str() form; throws mk::Error on anything else.
  static SymExpr parse(const std::string& text);
};

}  // namespace mk
