#include "ir/graph.h"

#include <fmt/format.h>

#include <cmath>

#include "ir/fused.h"
#include "ir/ops.h"
#include "ir/topk.h"
#include "support/error.h"

namespace mk {

namespace {
constexpr std::string_view kOpNames[] = {
#define MK_OP(name, n) #name,
#include "ir/ops.def"
#undef MK_OP
};
constexpr int kOpArity[] = {
#define MK_OP(name, n) n,
#include "ir/ops.def"
#undef MK_OP
};

std::string shape_text(const std::vector<SymExpr>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + s[i].str();
  return r + "]";
}
}  // namespace

std::string_view op_name(Op op) { return kOpNames[static_cast<int>(op)]; }
int op_arity(Op op) { return kOpArity[static_cast<int>(op)]; }
Op op_from_name(std::string_view name) {
  for (size_t i = 0; i < std::size(kOpNames); ++i)
    if (kOpNames[i] == name) return static_cast<Op>(i);
  fail("unknown op '{}'", name);
}

int64_t Node::attr_int(const std::string& k) const {
  auto it = attrs.find(k);
  if (it == attrs.end()) fail("%{} {}: missing attribute {}", id, op_name(op), k);
  if (auto* v = std::get_if<int64_t>(&it->second)) return *v;
  fail("%{} {}: attribute {} is not an integer", id, op_name(op), k);
}
int64_t Node::attr_int(const std::string& k, int64_t def) const { return attrs.count(k) ? attr_int(k) : def; }
double Node::attr_float(const std::string& k) const {
  auto it = attrs.find(k);
  if (it == attrs.end()) fail("%{} {}: missing attribute {}", id, op_name(op), k);
  if (auto* v = std::get_if<double>(&it->second)) return *v;
  if (auto* v = std::get_if<int64_t>(&it->second)) return static_cast<double>(*v);
  fail("%{} {}: attribute {} is not a number", id, op_name(op), k);
}
double Node::attr_float(const std::string& k, double def) const { return attrs.count(k) ? attr_float(k) : def; }
std::string Node::attr_str(const std::string& k) const {
  auto it = attrs.find(k);
  if (it == attrs.end()) fail("%{} {}: missing attribute {}", id, op_name(op), k);
  if (auto* v = std::get_if<std::string>(&it->second)) return *v;
  fail("%{} {}: attribute {} is not a string", id, op_name(op), k);
}
std::string Node::attr_str(const std::string& k, const std::string& def) const {
  return attrs.count(k) ? attr_str(k) : def;
}

void infer_node(const Graph& g, Node& n) {
  auto where = [&] { return fmt::format("%{} = {}", n.id, op_name(n.op)); };
  int ar = op_arity(n.op);
  if (ar >= 0 && static_cast<int>(n.inputs.size()) != ar)
    fail("{}: expected {} inputs, got {}", where(), ar, n.inputs.size());
  for (int in : n.inputs)
    if (in < 0 || in >= n.id) fail("{}: input %{} is not defined before it", where(), in);
  auto in = [&](int i) -> const Node& { return g.nodes[static_cast<size_t>(n.inputs.at(static_cast<size_t>(i)))]; };
  auto need_rank = [&](const Node& x, size_t r, const char* what) {
    if (x.shape.size() != r) fail("{}: {} must have rank {}, got {}", where(), what, r, shape_text(x.shape));
  };
  auto need_eq = [&](const SymExpr& a, const SymExpr& b, const char* what) {
    if (!(a == b)) fail("{}: {} mismatch: {} vs {}", where(), what, a.str(), b.str());
  };
  auto need_f32 = [&](const Node& x, const char* what) {
    if (x.dtype != DType::F32) fail("{}: {} must be f32, got {}", where(), what, dtype_name(x.dtype));
  };
  switch (n.op) {
    case Op::input: {
      std::string kind = n.attr_str("kind");
      if (kind != "tokens" && kind != "positions") fail("{}: unknown input kind '{}'", where(), kind);
      n.shape = {SymExpr::tokens()};
      n.dtype = DType::I32;
      return;
    }
    case Op::weight:
      if (n.weight.empty()) fail("{}: weight without a tensor name", where());
      if (n.shape.empty()) fail("{}: weight @{} without a shape", where(), n.weight);
      for (auto& d : n.shape)
        if (!d.is_const()) fail("{}: weight @{} has a symbolic shape", where(), n.weight);
      return;
    case Op::kv_cache: {
      int64_t kv_dim = n.attr_int("kv_dim");
      n.attr_int("layer");
      std::string kind = n.attr_str("kind");
      if (kind != "k" && kind != "v") fail("{}: kind must be k or v", where());
      if (kv_dim <= 0) fail("{}: bad cache size", where());
      KvGeometry kv = kv_geometry(n);
      n.shape = {SymExpr::constant(kv.pool_rows), SymExpr::constant(kv_dim)};
      n.dtype = DType::F32;
      return;
    }
    case Op::embed: {
      const Node& t = in(0);
      const Node& ids = in(1);
      need_rank(t, 2, "table");
      if (ids.dtype != DType::I32) fail("{}: ids must be i32", where());
      n.shape = {ids.shape.at(0), t.shape[1]};
      n.dtype = DType::F32;
      return;
    }
    case Op::rms_norm:
    case Op::layer_norm: {
      if (n.inputs.empty() || n.inputs.size() > (n.op == Op::rms_norm ? 2u : 3u))
        fail("{}: wrong number of inputs ({})", where(), n.inputs.size());
      const Node& x = in(0);
      need_rank(x, 2, "x");
      need_f32(x, "x");
      n.attr_float("eps");
      SymExpr cols = x.shape[1];
      int64_t group = n.attr_int("group", cols.c);
      if (group <= 0 || !cols.is_const() || cols.c % group != 0)
        fail("{}: group {} does not divide {} columns", where(), group, cols.str());
      for (size_t i = 1; i < n.inputs.size(); ++i) {
        const Node& w = in(static_cast<int>(i));
        need_rank(w, 1, "weight");
        need_eq(w.shape[0], SymExpr::constant(group), "weight length");
      }
      n.shape = x.shape;
      n.dtype = DType::F32;
      return;
    }
    case Op::matmul: {
      const Node& x = in(0);
      const Node& w = in(1);
      need_rank(x, 2, "x");
      need_f32(x, "x");
      need_rank(w, 2, "w");
      need_eq(x.shape[1], w.shape[1], "inner dimension");
      n.shape = {x.shape[0], w.shape[0]};
      n.dtype = DType::F32;
      return;
    }
    case Op::add:
    case Op::mul: {
      const Node& a = in(0);
      const Node& b = in(1);
      need_rank(a, 2, "a");
      need_f32(a, "a");
      if (b.shape.size() == 1 && n.op == Op::add) {
        need_eq(b.shape[0], a.shape[1], "bias length");
      } else {
        need_rank(b, 2, "b");
        need_f32(b, "b");
        need_eq(a.shape[0], b.shape[0], "rows");
        need_eq(a.shape[1], b.shape[1], "columns");
      }
      n.shape = a.shape;
      n.dtype = DType::F32;
      return;
    }
    case Op::scale:
      n.attr_float("s");
      [[fallthrough]];
    case Op::softcap:
      if (n.op == Op::softcap && !(n.attr_float("cap") > 0 && std::isfinite(n.attr_float("cap"))))
        fail("{}: cap {} must be a positive number", where(), n.attr_float("cap"));
      [[fallthrough]];
    case Op::silu:
    case Op::gelu:
    case Op::gelu_tanh:
      need_rank(in(0), 2, "x");
      need_f32(in(0), "x");
      n.shape = in(0).shape;
      n.dtype = DType::F32;
      return;
    case Op::rope: {
      const Node& x = in(0);
      need_rank(x, 2, "x");
      need_f32(x, "x");
      if (in(1).dtype != DType::I32) fail("{}: positions must be i32", where());
      int64_t hd = n.attr_int("head_dim"), n_rot = n.attr_int("n_rot", hd);
      n.attr_float("theta");
      std::string mode = n.attr_str("mode");
      if (mode != "adjacent" && mode != "halves") fail("{}: mode must be adjacent or halves", where());
      if (hd <= 0 || n_rot <= 0 || n_rot > hd || n_rot % 2 || !x.shape[1].is_const() || x.shape[1].c % hd)
        fail("{}: head_dim {} / n_rot {} do not fit {} columns", where(), hd, n_rot, x.shape[1].str());
      n.shape = x.shape;
      n.dtype = DType::F32;
      return;
    }
    case Op::kv_store: {
      const Node& x = in(0);
      const Node& c = in(1);
      need_rank(x, 2, "x");
      need_f32(x, "x");
      if (c.op != Op::kv_cache) fail("{}: second input must be a kv_cache", where());
      need_eq(x.shape[0], SymExpr::tokens(), "rows (must be n_tokens)");
      need_eq(x.shape[1], c.shape[1], "kv_dim");
      n.shape = c.shape;  // the whole pool: rows land at each row's KV slot
      n.dtype = DType::F32;
      return;
    }
    case Op::attention: {
      const Node& q = in(0);
      const Node& k = in(1);
      const Node& v = in(2);
      need_rank(q, 2, "q");
      need_rank(k, 2, "k");
      need_rank(v, 2, "v");
      auto is_store = [](const Node& s) {
        return s.op == Op::kv_store || (s.op == Op::fused_matmul && fused_matmul_layout(s).has_store());
      };
      if (!is_store(k) || !is_store(v)) fail("{}: k and v must come from kv_store", where());
      int64_t nh = n.attr_int("n_head"), nkv = n.attr_int("n_head_kv"), hd = n.attr_int("head_dim");
      n.attr_float("scale");
      if (n.attr_int("window", 0) < 0) fail("{}: window {} must be >= 0 (0 = none)", where(), n.attr_int("window", 0));
      if (const double cap = n.attr_float("softcap", 0.0); !(cap >= 0) || !std::isfinite(cap))
        fail("{}: softcap {} must be >= 0 (0 = none)", where(), cap);
      if (nh <= 0 || nkv <= 0 || nh % nkv) fail("{}: n_head {} is not a multiple of n_head_kv {}", where(), nh, nkv);
      need_eq(q.shape[1], SymExpr::constant(nh * hd), "q columns");
      need_eq(k.shape[1], SymExpr::constant(nkv * hd), "k columns");
      need_eq(v.shape[1], SymExpr::constant(nkv * hd), "v columns");
      n.shape = q.shape;
      n.dtype = DType::F32;
      return;
    }
    case Op::fused_matmul: {
      FusedMatmulLayout L = fused_matmul_layout(n);
      if (static_cast<int>(n.inputs.size()) != L.n_inputs)
        fail("{}: attributes need {} inputs, got {}", where(), L.n_inputs, n.inputs.size());
      const Node& x = in(L.x);
      const Node& w = in(L.w);
      need_rank(x, 2, "x");
      need_f32(x, "x");
      need_rank(w, 2, "w");
      need_eq(x.shape[1], w.shape[1], "inner dimension");
      if (L.w_up >= 0) {
        need_rank(in(L.w_up), 2, "w_up");
        need_eq(in(L.w_up).shape[0], w.shape[0], "w_up rows");
        need_eq(in(L.w_up).shape[1], w.shape[1], "w_up columns");
      }
      if (L.norm_w >= 0) {
        n.attr_float("eps");
        need_rank(in(L.norm_w), 1, "norm weight");
        need_eq(in(L.norm_w).shape[0], x.shape[1], "norm weight length");
      }
      std::vector<SymExpr> y = {x.shape[0], w.shape[0]};
      if (L.residual >= 0) {
        need_rank(in(L.residual), 2, "residual");
        need_f32(in(L.residual), "residual");
        if (in(L.residual).shape != y) fail("{}: residual shape mismatch", where());
      }
      if (L.has_rope()) {
        if (in(L.positions).dtype != DType::I32) fail("{}: positions must be i32", where());
        int64_t hd = n.attr_int("head_dim"), n_rot = n.attr_int("n_rot", hd);
        n.attr_float("theta");
        std::string mode = n.attr_str("mode");
        if (mode != "adjacent" && mode != "halves") fail("{}: mode must be adjacent or halves", where());
        if (hd <= 0 || n_rot <= 0 || n_rot > hd || n_rot % 2 || !y[1].is_const() || y[1].c % hd)
          fail("{}: head_dim {} / n_rot {} do not fit {} columns", where(), hd, n_rot, y[1].str());
      }
      if (L.has_store()) {
        const Node& c = in(L.cache);
        if (c.op != Op::kv_cache) fail("{}: cache input must be a kv_cache", where());
        need_eq(y[0], SymExpr::tokens(), "rows (must be n_tokens)");
        need_eq(y[1], c.shape[1], "kv_dim");
        y = c.shape;
      }
      n.shape = y;
      n.dtype = DType::F32;
      return;
    }
    case Op::moe_route: {
      const Node& x = in(0);
      need_rank(x, 2, "logits");
      need_f32(x, "logits");
      const int64_t k = n.attr_int("k");
      n.attr_int("norm", 1);
      if (!x.shape[1].is_const() || k < 1 || k > x.shape[1].c || k > kMoeMaxUsed)
        fail("{}: k = {} experts of {} (1 to min(n_expert, {}))", where(), k, x.shape[1].str(), kMoeMaxUsed);
      n.shape = {x.shape[0], SymExpr::constant(2 * k)};
      n.dtype = DType::F32;
      return;
    }
    case Op::moe_matmul: {
      if (n.inputs.size() != 3 && n.inputs.size() != 4) fail("{}: expected 3 or 4 inputs, got {}", where(), n.inputs.size());
      const Node& x = in(0);
      const Node& w = in(1);
      const Node& route = in(2);
      need_rank(x, 2, "x");
      need_f32(x, "x");
      need_rank(w, 3, "w");
      need_rank(route, 2, "route");
      if (!route.shape[1].is_const() || route.shape[1].c % 2 || route.shape[1].c < 2)
        fail("{}: route must have 2k columns (moe_route), got {}", where(), route.shape[1].str());
      need_eq(x.shape[0], route.shape[0], "rows");
      const int64_t k = route.shape[1].c / 2;
      const bool reduce = n.attr_int("reduce", 0) != 0;
      need_eq(x.shape[1], SymExpr::constant(reduce ? k * w.shape[2].c : w.shape[2].c), "inner dimension");
      if (n.inputs.size() == 4) {
        const std::string glu = n.attr_str("glu");
        if (glu != "silu" && glu != "gelu" && glu != "gelu_tanh") fail("{}: glu must be silu, gelu or gelu_tanh", where());
        if (reduce) fail("{}: a GLU (w_up) only on expand", where());
        if (in(3).shape != w.shape) fail("{}: w_up shape {} differs from w {}", where(), shape_text(in(3).shape), shape_text(w.shape));
      }
      n.shape = {x.shape[0], SymExpr::constant(reduce ? w.shape[1].c : k * w.shape[1].c)};
      n.dtype = DType::F32;
      return;
    }
    case Op::last_row:
      need_rank(in(0), 2, "x");
      n.shape = {SymExpr::out(), in(0).shape[1]};
      n.dtype = in(0).dtype;
      return;
    case Op::argmax:
      need_rank(in(0), 2, "x");
      need_f32(in(0), "x");
      n.shape = {in(0).shape[0], SymExpr::constant(4)};
      n.dtype = DType::I32;
      return;
    case Op::topk: {
      need_rank(in(0), 2, "x");
      need_f32(in(0), "x");
      const int64_t k = n.attr_int("k");
      if (k < 1 || k > kTopKLimit) fail("{}: k = {} outside [1, {}]", where(), k, kTopKLimit);
      n.shape = {in(0).shape[0], SymExpr::constant(4 + 2 * k)};
      n.dtype = DType::I32;
      return;
    }
  }
  fail("{}: unhandled op", where());
}

int Graph::add(Op op, std::vector<int> inputs, Attrs attrs, std::string name) {
  Node n;
  n.id = size();
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.name = std::move(name);
  infer_node(*this, n);
  nodes.push_back(std::move(n));
  return nodes.back().id;
}

int Graph::add_weight(const std::string& tensor_name, DType dtype, std::vector<int64_t> shape) {
  Node n;
  n.id = size();
  n.op = Op::weight;
  n.weight = tensor_name;
  n.dtype = dtype;
  for (auto d : shape) n.shape.push_back(SymExpr::constant(d));
  infer_node(*this, n);
  nodes.push_back(std::move(n));
  return nodes.back().id;
}

int Graph::add_input(const std::string& kind) { return add(Op::input, {}, {{"kind", kind}}, "inp_" + kind); }

int Graph::add_kv_cache(int layer, const std::string& kind, int64_t n_ctx, int64_t kv_dim, int64_t kv_pool_tokens,
                        int64_t kv_block_size) {
  Attrs a{{"layer", int64_t{layer}}, {"kind", kind}, {"n_ctx", n_ctx}, {"kv_dim", kv_dim}};
  const int64_t block = kv_block_size > 0 ? kv_block_size : std::min(kDefaultKvBlockSize, n_ctx);
  if (kv_block_size > 0) a["kv_block"] = kv_block_size;
  if (kv_pool_tokens > 0) a["kv_pool"] = (kv_pool_tokens + block - 1) / block * block;  // whole blocks
  return add(Op::kv_cache, {}, std::move(a), fmt::format("cache_{}_l{}", kind, layer));
}

KvGeometry kv_geometry(const Node& n) {
  KvGeometry g;
  g.n_ctx = n.attr_int("n_ctx");
  if (g.n_ctx <= 0) fail("%{}: kv_cache n_ctx must be positive, got {}", n.id, g.n_ctx);
  g.block_size = n.attr_int("kv_block", std::min(kDefaultKvBlockSize, g.n_ctx));
  if (g.block_size <= 0 || g.block_size > (int64_t{1} << 20))
    fail("%{}: kv_cache kv_block must be in [1, 2^20], got {}", n.id, g.block_size);
  g.pool_rows = n.attr_int("kv_pool", (g.n_ctx + g.block_size - 1) / g.block_size * g.block_size);
  if (g.pool_rows <= 0 || g.pool_rows % g.block_size || g.pool_rows > (int64_t{1} << 31) - 1)
    fail("%{}: kv_cache kv_pool {} must be a positive multiple of kv_block {} below 2^31", n.id, g.pool_rows, g.block_size);
  return g;
}

namespace {
std::string attr_text(const AttrValue& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) {
    std::string s = fmt::format("{}", *d);
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a float on re-parse
    return s;
  }
  return fmt::format("\"{}\"", std::get<std::string>(v));
}
}  // namespace

std::string node_str(const Graph& g, const Node& n) {
  std::string s = fmt::format("%{} = {}", n.id, op_name(n.op));
  if (n.op == Op::weight) s += " @" + n.weight;
  for (size_t i = 0; i < n.inputs.size(); ++i) s += fmt::format("{} %{}", i ? "," : "", n.inputs[i]);
  if (!n.attrs.empty()) {
    s += " {";
    bool first = true;
    for (auto& [k, v] : n.attrs) {
      s += (first ? "" : ", ") + k + "=" + attr_text(v);
      first = false;
    }
    s += "}";
  }
  s += fmt::format(" : {}{}", dtype_name(n.dtype), shape_text(n.shape));
  if (!n.name.empty()) s += fmt::format(" \"{}\"", n.name);
  return s;
}

std::string Graph::str() const {
  std::string s = "graph {\n";
  for (const Node& n : nodes) s += "  " + node_str(*this, n) + "\n";
  for (const auto& o : outputs) s += fmt::format("  output %{} \"{}\"\n", o.value, o.name);
  return s + "}\n";
}

void verify_graph(const Graph& g) {
  auto context = [&](int id) {
    std::string s;
    for (int i = std::max(0, id - 2); i <= std::min(g.size() - 1, id + 2); ++i)
      s += fmt::format("{} {}\n", i == id ? ">>" : "  ", node_str(g, g.nodes[static_cast<size_t>(i)]));
    return s;
  };
  for (int i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes[static_cast<size_t>(i)];
    if (n.id != i) fail("verify: value at position {} has id %{}\n{}", i, n.id, context(i));
    Node copy = n;
    try {
      infer_node(g, copy);
    } catch (const Error& e) {
      fail("verify: {}\n{}", e.what(), context(i));
    }
    if (copy.shape != n.shape || copy.dtype != n.dtype)
      fail("verify: %{} has type {}{} but its inputs give {}{}\n{}", i, dtype_name(n.dtype), shape_text(n.shape),
           dtype_name(copy.dtype), shape_text(copy.shape), context(i));
  }
  if (g.outputs.empty()) fail("verify: graph has no outputs");
  for (const auto& o : g.outputs)
    if (o.value < 0 || o.value >= g.size()) fail("verify: output {} names undefined value %{}", o.name, o.value);
}

}  // namespace mk
