// Pass "fuse": folds neighbours of matmuls into one fused_matmul op (ops.def), so the values in
// between are never written to memory and one instruction grid does the work of several.
//
//   glu       mul(act(matmul(x, wg)), matmul(x, wu))        -> fused_matmul{glu=act}
//             mul(act(moe_matmul(x, wg, r)), moe_matmul(x, wu, r)) (expand, one weight dtype)
//                                                           -> moe_matmul(x, wg, r, wu){glu=act}
//   epilogue  kv_store(rope(mm, pos), cache)                -> {epi=rope_store}
//             kv_store(mm, cache) / rope(mm, pos)           -> {epi=store} / {epi=rope}
//             add(r, mm) or add(mm, r)                      -> {epi=add} (residual)
//   prologue  mm(rms_norm(x, w), ...) for every reader of a full-row rms_norm when all its readers
//             are matmuls                                   -> {pro=rms_norm}: each tile normalises
//                                                              the rows it reads itself
// A matmul is absorbed only when its result has exactly one reader and is not a graph output, and
// only into one epilogue. The arithmetic per element is unchanged (same functions, same order),
// so fused and unfused programs give bitwise identical results.
#include "ir/fused.h"
#include "model/dtype.h"
#include "passes/graph_edit.h"
#include "passes/pass.h"

namespace mk {

namespace {

// The parts of a (fused) matmul, independent of the input order.
struct Parts {
  int x = -1, w = -1, w_up = -1, norm_w = -1, residual = -1, positions = -1, cache = -1;
  Attrs attrs;  // pro/glu/epi and their parameters
};

Parts parts_of(const Node& n) {
  Parts p;
  if (n.op == Op::matmul) {
    p.x = n.inputs[0];
    p.w = n.inputs[1];
    return p;
  }
  FusedMatmulLayout L = fused_matmul_layout(n);
  auto at = [&](int i) { return i >= 0 ? n.inputs[static_cast<size_t>(i)] : -1; };
  p.x = at(L.x);
  p.w = at(L.w);
  p.w_up = at(L.w_up);
  p.norm_w = at(L.norm_w);
  p.residual = at(L.residual);
  p.positions = at(L.positions);
  p.cache = at(L.cache);
  p.attrs = n.attrs;
  return p;
}

void set_parts(Node& n, const Parts& p) {
  n.op = Op::fused_matmul;
  n.attrs = p.attrs;
  n.inputs = {p.x, p.w};
  for (int v : {p.w_up, p.norm_w, p.residual, p.positions, p.cache})
    if (v >= 0) n.inputs.push_back(v);
}

// Two expand moe_matmuls of one x and one route over weights of one dtype, without a GLU yet.
bool moe_glu(const Graph& g, int gate, int up) {
  const Node &a = g[gate], &b = g[up];
  if (a.op != Op::moe_matmul || b.op != Op::moe_matmul || a.inputs.size() != 3 || b.inputs.size() != 3) return false;
  if (a.attr_int("reduce", 0) != 0 || b.attr_int("reduce", 0) != 0) return false;
  return a.inputs[0] == b.inputs[0] && a.inputs[2] == b.inputs[2] && g[a.inputs[1]].dtype == g[b.inputs[1]].dtype &&
         g[a.inputs[1]].shape == g[b.inputs[1]].shape;
}

std::string epi_of(const Node& n) { return n.op == Op::fused_matmul ? n.attr_str("epi", "none") : "none"; }

}  // namespace

void run_fuse(PassContext& cx) {
  GraphEditor ed(cx.graph);
  Graph& g = ed.graph();
  auto users = ed.consumers();
  auto single_reader = [&](int v, int reader) {
    const auto& u = users[static_cast<size_t>(v)];
    return u.size() == 1 && u[0] == reader && !ed.is_output(v);
  };
  auto is_mm = [&](int v) { return g[v].op == Op::matmul || g[v].op == Op::fused_matmul; };
  // A matmul whose result only `reader` reads and that has no epilogue yet.
  auto absorbable = [&](int v, int reader) { return is_mm(v) && epi_of(g[v]) == "none" && single_reader(v, reader); };

  // GLU: mul(act(gate), up) in either operand order.
  for (int id = 0; id < g.size(); ++id) {
    if (g[id].op != Op::mul) continue;
    for (int side = 0; side < 2; ++side) {
      int a = g[id].inputs[static_cast<size_t>(side)], b = g[id].inputs[static_cast<size_t>(1 - side)];
      Op act = g[a].op;
      if (act != Op::silu && act != Op::gelu && act != Op::gelu_tanh) continue;
      int gate = g[a].inputs[0];
      if (moe_glu(g, gate, b) && single_reader(a, id) && single_reader(gate, a) && single_reader(b, id)) {
        Node& n = ed.node(id);  // the experts' gate and up in one expand: act(x @ wg[e]^T) * (x @ wu[e]^T)
        n.op = Op::moe_matmul;
        n.inputs = {g[gate].inputs[0], g[gate].inputs[1], g[gate].inputs[2], g[b].inputs[1]};
        n.attrs = {{"reduce", int64_t{0}}, {"glu", std::string(op_name(act))}};
        break;
      }
      if (!single_reader(a, id) || g[gate].op != Op::matmul || g[b].op != Op::matmul) continue;
      if (!single_reader(gate, a) || !single_reader(b, id) || g[gate].inputs[0] != g[b].inputs[0]) continue;
      // One block-quantized and one float weight (a file quantized tensor by tensor) stay two
      // matmuls: a backend that quantizes activations for block weights (the cpu's llama.cpp
      // numerics) does so for one of them only, which one fused op reading one activation row cannot.
      if (dtype_is_quantized(g[g[gate].inputs[1]].dtype) != dtype_is_quantized(g[g[b].inputs[1]].dtype)) continue;
      Parts p;
      p.x = g[gate].inputs[0];
      p.w = g[gate].inputs[1];
      p.w_up = g[b].inputs[1];
      p.attrs["glu"] = std::string(op_name(act));
      set_parts(ed.node(id), p);
      break;
    }
  }
  users = ed.consumers();

  // Epilogues: kv_store (with or without rope) first, then the remaining ropes, then residual adds.
  for (int id = 0; id < g.size(); ++id) {
    if (g[id].op != Op::kv_store) continue;
    int x = g[id].inputs[0], cache = g[id].inputs[1];
    if (g[x].op == Op::rope && single_reader(x, id) && absorbable(g[x].inputs[0], x)) {
      Parts p = parts_of(g[g[x].inputs[0]]);
      for (const auto& [k, v] : g[x].attrs) p.attrs[k] = v;
      p.attrs["epi"] = std::string("rope_store");
      p.positions = g[x].inputs[1];
      p.cache = cache;
      set_parts(ed.node(id), p);
    } else if (absorbable(x, id)) {
      Parts p = parts_of(g[x]);
      p.attrs["epi"] = std::string("store");
      p.cache = cache;
      set_parts(ed.node(id), p);
    }
  }
  users = ed.consumers();
  for (int id = 0; id < g.size(); ++id) {
    if (g[id].op != Op::rope || !absorbable(g[id].inputs[0], id)) continue;
    Parts p = parts_of(g[g[id].inputs[0]]);
    for (const auto& [k, v] : g[id].attrs) p.attrs[k] = v;
    p.attrs["epi"] = std::string("rope");
    p.positions = g[id].inputs[1];
    set_parts(ed.node(id), p);
  }
  users = ed.consumers();
  for (int id = 0; id < g.size(); ++id) {
    if (g[id].op != Op::add) continue;
    int a = g[id].inputs[0], b = g[id].inputs[1];
    if (g[a].shape != g[b].shape || g[a].op == Op::weight || g[b].op == Op::weight) continue;
    // Prefer the matmul computed last: "the matmul that precedes the add".
    int mm = -1, res = -1;
    if (absorbable(b, id)) mm = b, res = a;
    if (absorbable(a, id) && (mm < 0 || a > b)) mm = a, res = b;
    if (mm < 0) continue;
    Parts p = parts_of(g[mm]);
    p.attrs["epi"] = std::string("add");
    p.residual = res;
    set_parts(ed.node(id), p);
  }
  users = ed.consumers();

  // Prologue: a full-row rms_norm read only by matmuls as their x.
  for (int id = 0; id < g.size(); ++id) {
    const Node& nrm = g[id];
    if (nrm.op != Op::rms_norm || nrm.inputs.size() != 2 || ed.is_output(id)) continue;
    if (nrm.attr_int("group", nrm.shape[1].c) != nrm.shape[1].c) continue;
    const auto& readers = users[static_cast<size_t>(id)];
    bool ok = !readers.empty();
    for (int r : readers) {
      if (!is_mm(r)) { ok = false; break; }
      Parts p = parts_of(g[r]);
      if (p.x != id || p.norm_w >= 0 || p.residual == id) ok = false;
    }
    if (!ok) continue;
    for (int r : readers) {
      Parts p = parts_of(g[r]);
      p.x = nrm.inputs[0];
      p.norm_w = nrm.inputs[1];
      p.attrs["pro"] = std::string("rms_norm");
      p.attrs["eps"] = nrm.attr_float("eps");
      p.attrs["weight_offset"] = nrm.attr_float("weight_offset", 0.0);
      set_parts(ed.node(r), p);
    }
  }
  ed.commit();
}

}  // namespace mk
