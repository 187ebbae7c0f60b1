#include "passes/graph_edit.h"

#include <queue>

#include "support/error.h"

namespace mk {

GraphEditor::GraphEditor(Graph& g) : g_(g) {
  for (int i = 0; i < g_.size(); ++i) key_.push_back(i);
}

int GraphEditor::add(Node n, int after_key_of) {
  n.id = g_.size();
  g_.nodes.push_back(std::move(n));
  // Between the anchor and the next original node; later additions after earlier ones.
  key_.push_back(key_.at(static_cast<size_t>(after_key_of)) + 1e-3 + 1e-9 * static_cast<double>(g_.size()));
  return g_.size() - 1;
}

std::vector<char> GraphEditor::live() const {
  std::vector<char> live(g_.nodes.size(), 0);
  std::vector<int> stack;
  for (const auto& o : g_.outputs) stack.push_back(o.value);
  while (!stack.empty()) {
    int v = stack.back();
    stack.pop_back();
    if (live[static_cast<size_t>(v)]) continue;
    live[static_cast<size_t>(v)] = 1;
    for (int i : g_.nodes[static_cast<size_t>(v)].inputs) stack.push_back(i);
  }
  return live;
}

std::vector<std::vector<int>> GraphEditor::consumers() const {
  std::vector<std::vector<int>> c(static_cast<size_t>(g_.size()));
  std::vector<char> alive = live();
  for (const Node& n : g_.nodes)
    for (int i : n.inputs) {
      if (!alive[static_cast<size_t>(n.id)]) continue;
      auto& v = c[static_cast<size_t>(i)];
      if (v.empty() || v.back() != n.id) v.push_back(n.id);
    }
  return c;
}

bool GraphEditor::is_output(int id) const {
  for (const auto& o : g_.outputs)
    if (o.value == id) return true;
  return false;
}

void GraphEditor::commit() {
  const size_t n = g_.nodes.size();
  std::vector<char> live = this->live();
  // Kahn's algorithm over live nodes, smallest placement key first.
  std::vector<int> pending(n, 0);
  std::vector<std::vector<int>> users(n);
  for (size_t v = 0; v < n; ++v) {
    if (!live[v]) continue;
    for (int i : g_.nodes[v].inputs) {
      pending[v]++;
      users[static_cast<size_t>(i)].push_back(static_cast<int>(v));
    }
  }
  using Item = std::pair<double, int>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> ready;
  for (size_t v = 0; v < n; ++v)
    if (live[v] && pending[v] == 0) ready.push({key_[v], static_cast<int>(v)});
  std::vector<int> order, new_id(n, -1);
  while (!ready.empty()) {
    int v = ready.top().second;
    ready.pop();
    new_id[static_cast<size_t>(v)] = static_cast<int>(order.size());
    order.push_back(v);
    for (int u : users[static_cast<size_t>(v)])
      if (--pending[static_cast<size_t>(u)] == 0) ready.push({key_[static_cast<size_t>(u)], u});
  }
  size_t n_live = 0;
  for (char l : live) n_live += l != 0;
  MK_CHECK(order.size() == n_live, "graph rewrite produced a cycle");
  Graph out;
  out.outputs = g_.outputs;
  for (auto& o : out.outputs) o.value = new_id[static_cast<size_t>(o.value)];
  for (int v : order) {
    Node nd = g_.nodes[static_cast<size_t>(v)];
    nd.id = out.size();
    for (int& i : nd.inputs) i = new_id[static_cast<size_t>(i)];
    if (nd.op != Op::weight) infer_node(out, nd);
    out.nodes.push_back(std::move(nd));
  }
  g_ = std::move(out);
  key_.clear();
  for (int i = 0; i < g_.size(); ++i) key_.push_back(i);
}

}  // namespace mk
