// In-place graph rewriting for the graph passes: nodes may be appended out of order and dead nodes
// left behind; commit() restores the Graph invariants (topological ids, inferred shapes, no dead
// values) deterministically.
#pragma once
#include <vector>

#include "ir/graph.h"

namespace mk {

class GraphEditor {
 public:
  explicit GraphEditor(Graph& g);
  Graph& graph() { return g_; }
  Node& node(int id) { return g_.nodes.at(static_cast<size_t>(id)); }
  // Appends a node placed, in the final order, as soon after `after_key_of` as its inputs allow.
  int add(Node n, int after_key_of);
  // Values the outputs reach.
  std::vector<char> live() const;
  // Consumers of every value among live values (recomputed on each call; graphs are small).
  std::vector<std::vector<int>> consumers() const;
  bool is_output(int id) const;
  // Stable topological sort by placement keys, drops values the outputs do not reach, renumbers
  // and re-infers every shape.
  void commit();

 private:
  Graph& g_;
  std::vector<double> key_;
};

}  // namespace mk
