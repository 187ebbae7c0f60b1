#include <fmt/ranges.h>

#include "backend/backend.h"
#include "backend/cuda/driver.h"
#include "support/error.h"

namespace mk {

namespace {
struct BackendEntry {
  const char* name;
  BackendFactory make;
};
// Every backend; default_backend_name() picks one for machines with and without a GPU.
const BackendEntry kBackends[] = {
    {"cpu", make_cpu_backend},
    {"reference", make_reference_backend},
    {"cuda", make_cuda_backend},
    {"cuda-perop", make_cuda_perop_backend},
    {"cuda-graph", make_cuda_graph_backend},
    {"cuda-emu", make_cuda_emu_backend},
};
}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> r;
  for (const auto& b : kBackends) r.emplace_back(b.name);
  return r;
}

// The CUDA megakernel where a GPU and driver are present, else the CPU megakernel interpreter.
std::string default_backend_name() { return cuda::cuda_available(nullptr) ? "cuda" : "cpu"; }

std::vector<float> Backend::forward(const StepBatch&) {
  fail("backend '{}' does not run ragged batches (no paged KV cache)", name());
}

std::unique_ptr<Backend> make_backend(const std::string& name, const Graph& graph, const ModelFile& model,
                                      const BackendOptions& options) {
  for (const auto& b : kBackends)
    if (name == b.name) return b.make(graph, model, options);
  fail("unknown backend '{}'; available: {}", name, fmt::join(backend_names(), ", "));
}

}  // namespace mk
