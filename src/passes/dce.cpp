// Pass "dce": compute only what is read.
//
// 1. Row pruning: `last_row` is moved above the row-wise ops that produce its input (norms,
//    matmuls, elementwise ops) as long as that input has no other reader, so e.g. the classifier,
//    the final norm and the last layer's FFN run on one row instead of n_tokens. Identical
//    last_row(v) nodes are shared.
// 2. Values that no output reaches are dropped (GraphEditor::commit).
#include <map>

#include "passes/graph_edit.h"
#include "passes/pass.h"

namespace mk {

namespace {

// Inputs of `n` that are row-aligned with its output (a last_row of the output is the op applied
// to last rows of these), or an empty optional-like flag when `n` is not row-wise.
bool row_inputs(const Graph& g, const Node& n, std::vector<bool>& row_aligned) {
  row_aligned.assign(n.inputs.size(), false);
  auto is_2d_act = [&](int v) { return g[v].shape.size() == 2 && g[v].op != Op::weight; };
  switch (n.op) {
    case Op::rms_norm:
    case Op::layer_norm:
    case Op::matmul:
    case Op::scale:
    case Op::softcap:
    case Op::silu:
    case Op::gelu:
    case Op::gelu_tanh:
      if (!is_2d_act(n.inputs[0])) return false;
      row_aligned[0] = true;
      return true;
    case Op::moe_route:
      if (!is_2d_act(n.inputs[0])) return false;
      row_aligned[0] = true;
      return true;
    case Op::moe_matmul:  // x and the route
      row_aligned[0] = row_aligned[2] = true;
      return true;
    case Op::add:
    case Op::mul:
      for (size_t i = 0; i < n.inputs.size(); ++i) row_aligned[i] = is_2d_act(n.inputs[i]);
      return row_aligned[0];
    default:
      return false;
  }
}

}  // namespace

void run_dce(PassContext& cx) {
  GraphEditor ed(cx.graph);
  Graph& g = ed.graph();
  bool changed = true;
  while (changed) {
    changed = false;
    auto users = ed.consumers();
    auto alive = ed.live();
    std::map<int, int> last_of;  // value -> a last_row node reading it
    for (const Node& n : g.nodes)
      if (n.op == Op::last_row && !users[static_cast<size_t>(n.id)].empty()) last_of.emplace(n.inputs[0], n.id);
    for (const Node& n : g.nodes)
      if (n.op == Op::last_row && ed.is_output(n.id)) last_of.emplace(n.inputs[0], n.id);
    for (int id = 0; id < g.size() && !changed; ++id) {
      if (g[id].op != Op::last_row || !alive[static_cast<size_t>(id)]) continue;
      // A value that was already pruned to one row needs no last_row.
      const int src = g[id].inputs[0];
      const Node& s = g[src];
      std::vector<bool> aligned;
      if (users[static_cast<size_t>(src)].size() != 1 || ed.is_output(src) || !row_inputs(g, s, aligned)) continue;
      if (!(s.shape[0] == SymExpr::tokens())) continue;
      Node sunk = s;  // the op, now applied to last rows of its row-aligned inputs
      for (size_t i = 0; i < sunk.inputs.size(); ++i) {
        if (!aligned[i]) continue;
        int v = sunk.inputs[i];
        auto it = last_of.find(v);
        if (it == last_of.end()) {
          Node lr;
          lr.op = Op::last_row;
          lr.inputs = {v};
          lr.name = g[v].name.empty() ? std::string() : g[v].name + ".last";
          int nid = ed.add(std::move(lr), v);
          it = last_of.emplace(v, nid).first;
        }
        sunk.inputs[i] = it->second;
      }
      Node& l = ed.node(id);
      sunk.id = id;
      if (!l.name.empty()) sunk.name = l.name;
      else if (!s.name.empty()) sunk.name = s.name + ".last";
      l = std::move(sunk);
      changed = true;
    }
  }
  ed.commit();
}

}  // namespace mk
