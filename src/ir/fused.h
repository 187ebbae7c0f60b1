// Operand layout of Op::fused_matmul (see ops.def): which input slot holds what, derived from the
// node's attributes. Shared by shape inference, the fuse pass and lowering so the order is defined once.
#pragma once
#include <string>

#include "ir/graph.h"

namespace mk {

struct FusedMatmulLayout {
  // Input positions; -1 when absent.
  int x = 0, w = 1, w_up = -1, norm_w = -1, residual = -1, positions = -1, cache = -1;
  std::string pro = "none";  // none | rms_norm
  std::string glu = "none";  // none | silu | gelu | gelu_tanh
  std::string epi = "none";  // none | add | rope | store | rope_store
  int n_inputs = 2;

  bool has_rope() const { return epi == "rope" || epi == "rope_store"; }
  bool has_store() const { return epi == "store" || epi == "rope_store"; }
};

// Throws mk::Error for unknown attribute values.
FusedMatmulLayout fused_matmul_layout(const Node& n);

}  // namespace mk
