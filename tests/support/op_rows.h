// Hand-made logits rows through the argmax or topk op alone, for the device-output tests (greedy
// ids, top-k candidates): a graph embed(table, tokens) -> op, graph outputs "logits" (the rows) and
// the op's, where token id r picks row r of `rows` (all of one length), so the rows reach the op
// exactly as written. One step over every row in order, every row a logit row.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "ir/graph.h"
#include "model/model_file.h"

namespace mk::test {

// The model (one weight, "table": the rows) and the graph with `add_op(graph, rows_value) -> op
// value` as the output named `output`.
struct OpRowsModel {
  ModelFile model;
  Graph graph;
};
template <class AddOp>
OpRowsModel op_rows_model(const std::vector<std::vector<float>>& rows, const std::string& output, AddOp add_op) {
  const auto n_rows = static_cast<int64_t>(rows.size());
  const auto cols = static_cast<int64_t>(rows[0].size());
  auto data = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(n_rows * cols) * 4);
  for (int64_t r = 0; r < n_rows; ++r)
    std::memcpy(data->data() + r * cols * 4, rows[static_cast<size_t>(r)].data(), static_cast<size_t>(cols) * 4);
  ModelFile m;
  m.path = output + "-op-test";
  m.format = "synthetic";
  m.owned.push_back(data);
  WeightTensor w;
  w.name = "table";
  w.shape = {n_rows, cols};
  w.data = data->data();
  w.nbytes = data->size();
  m.add_tensor(w);
  Graph g;
  int tok = g.add_input("tokens");
  int e = g.add(Op::embed, {g.add_weight("table", DType::F32, {n_rows, cols}), tok}, {}, "rows");
  g.add_output(e, "logits");
  g.add_output(add_op(g, e), output);
  return {std::move(m), std::move(g)};
}

// op_rows_model's step over every row on `backend`: returns `read(backend, batch)`.
template <class AddOp, class Read>
auto run_op_rows(const std::string& backend, const BackendOptions& options, const std::vector<std::vector<float>>& rows,
                 const std::string& output, AddOp add_op, Read read) {
  const auto n_rows = static_cast<int64_t>(rows.size());
  const OpRowsModel om = op_rows_model(rows, output, add_op);
  auto b = make_backend(backend, om.graph, om.model, options);
  std::vector<int32_t> order(static_cast<size_t>(n_rows));
  for (int32_t i = 0; i < n_rows; ++i) order[static_cast<size_t>(i)] = i;
  return read(*b, one_sequence_batch(order, 0, b->kv_block_size(), true));
}

// forward_greedy's rows: the argmax op (graph output "greedy").
inline std::vector<GreedyRow> greedy_of_rows(const std::string& backend, const BackendOptions& options,
                                             const std::vector<std::vector<float>>& rows) {
  return run_op_rows(
      backend, options, rows, "greedy", [](Graph& g, int x) { return g.add(Op::argmax, {x}, {}, "greedy"); },
      [](Backend& b, const StepBatch& batch) { return b.forward_greedy(batch); });
}

// forward_topk's rows: the topk op with k candidates (graph output "topk").
inline std::vector<TopKRow> topk_of_rows(const std::string& backend, const BackendOptions& options,
                                         const std::vector<std::vector<float>>& rows, int64_t k) {
  return run_op_rows(
      backend, options, rows, "topk", [k](Graph& g, int x) { return g.add(Op::topk, {x}, {{"k", k}}, "topk"); },
      [](Backend& b, const StepBatch& batch) { return b.forward_topk(batch); });
}

}  // namespace mk::test
