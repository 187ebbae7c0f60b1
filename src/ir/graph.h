// The graph IR: a list of values in topological order (a value's inputs have smaller ids).
//
// Each value is one op's result with a symbolic shape (outermost first) over n_tokens/n_past.
// Text form (deterministic, round-trips through parse_graph):
//   %3 = rms_norm %2, %1 {eps=1e-05, group=64, weight_offset=0} : f32[n_tokens, 64] "blk.0.attn_norm"
//   %1 = weight @blk.0.attn_norm.weight : f32[64]
// Names label intermediates (`blk.3.attn_norm`) so backends can be diffed by name.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ir/sym.h"
#include "model/dtype.h"

namespace mk {

enum class Op : uint8_t {
#define MK_OP(name, n) name,
#include "ir/ops.def"
#undef MK_OP
};
std::string_view op_name(Op op);
int op_arity(Op op);  // -1 = variadic
Op op_from_name(std::string_view name);  // throws mk::Error

using AttrValue = std::variant<int64_t, double, std::string>;
using Attrs = std::map<std::string, AttrValue>;

struct Node {
  int id = -1;
  Op op = Op::input;
  std::vector<int> inputs;
  std::vector<SymExpr> shape;
  DType dtype = DType::F32;
  std::string weight;  // for Op::weight: the tensor's name in the model file
  std::string name;    // label of the intermediate, may be empty
  Attrs attrs;

  int64_t attr_int(const std::string& k) const;
  int64_t attr_int(const std::string& k, int64_t def) const;
  double attr_float(const std::string& k) const;
  double attr_float(const std::string& k, double def) const;
  std::string attr_str(const std::string& k) const;
  std::string attr_str(const std::string& k, const std::string& def) const;
};

struct GraphOutput {
  int value = -1;
  std::string name;  // "logits"
};

// The output a step returns as floats (Backend::forward): "logits" [rows, n_vocab], or "embd"
// [rows, n_embd] in an embedding graph (BuildOptions::embeddings).
inline bool is_main_output(std::string_view name) { return name == "logits" || name == "embd"; }

class Graph {
 public:
  std::vector<Node> nodes;
  std::vector<GraphOutput> outputs;

  const Node& operator[](int id) const { return nodes.at(static_cast<size_t>(id)); }
  Node& operator[](int id) { return nodes.at(static_cast<size_t>(id)); }
  int size() const { return static_cast<int>(nodes.size()); }

  // Appends a node; its shape and dtype are inferred from the inputs (throws mk::Error on mismatch).
  int add(Op op, std::vector<int> inputs, Attrs attrs = {}, std::string name = {});
  int add_weight(const std::string& tensor_name, DType dtype, std::vector<int64_t> shape);
  int add_input(const std::string& kind);  // "tokens" | "positions"
  // A layer's K or V pool (see KvGeometry); kv_pool_tokens / kv_block_size 0 = the defaults.
  int add_kv_cache(int layer, const std::string& kind, int64_t n_ctx, int64_t kv_dim, int64_t kv_pool_tokens = 0,
                   int64_t kv_block_size = 0);
  void add_output(int value, std::string name) { outputs.push_back({value, std::move(name)}); }

  std::string str() const;  // the text form
};

// Paged KV geometry of a kv_cache node {n_ctx, kv_dim[, kv_pool][, kv_block]}: a sequence holds at
// most n_ctx positions; the pool has pool_rows rows (attr kv_pool, default n_ctx rounded up to
// whole blocks) in blocks of block_size rows (attr kv_block, default 16, or n_ctx when smaller). Every layer's pool has the
// same geometry, so one block table addresses them all (backend/step_batch.h).
struct KvGeometry {
  int64_t n_ctx = 0, block_size = 0, pool_rows = 0;
  int64_t pool_blocks() const { return block_size > 0 ? pool_rows / block_size : 0; }
  int64_t max_blocks_per_seq() const { return block_size > 0 ? (n_ctx + block_size - 1) / block_size : 0; }
};
constexpr int64_t kDefaultKvBlockSize = 16;
// Throws mk::Error for a non-positive size or a pool that is not a whole number of blocks.
KvGeometry kv_geometry(const Node& kv_cache);

// Computes the shape and dtype of `n` from its inputs in `g`; throws mk::Error naming the op.
void infer_node(const Graph& g, Node& n);
// Checks ids, topological order, arity, inferred shapes and outputs; throws mk::Error with the
// offending value's line and the IR around it.
void verify_graph(const Graph& g);
Graph parse_graph(std::string_view text);
std::string node_str(const Graph& g, const Node& n);

}  // namespace mk
