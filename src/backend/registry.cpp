#include <fmt/ranges.h>

#include "backend/backend.h"
#include "support/error.h"

namespace mk {

namespace {
struct BackendEntry {
  const char* name;
  BackendFactory make;
};
// Every backend, in order of preference for the default (the first available one wins).
const BackendEntry kBackends[] = {
    {"reference", make_reference_backend},
    {"cuda", make_cuda_backend},
    {"cuda-perop", make_cuda_perop_backend},
    {"cuda-graph", make_cuda_graph_backend},
};
}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> r;
  for (const auto& b : kBackends) r.emplace_back(b.name);
  return r;
}

std::string default_backend_name() {
  for (const auto& b : kBackends)
    if (std::string(b.name) == "cpu") return "cpu";
  return "reference";
}

std::unique_ptr<Backend> make_backend(const std::string& name, const Graph& graph, const ModelFile& model,
                                      const BackendOptions& options) {
  for (const auto& b : kBackends)
    if (name == b.name) return b.make(graph, model, options);
  fail("unknown backend '{}'; available: {}", name, fmt::join(backend_names(), ", "));
}

}  // namespace mk
