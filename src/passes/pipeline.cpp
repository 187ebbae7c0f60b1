// The whole compiler on one screen.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "passes/pass.h"
#include "support/error.h"
#include "support/printable.h"

namespace mk {

const std::vector<Pass>& default_pipeline() {
  static const std::vector<Pass> passes = {
      {"dce", run_dce, true},             // compute only what outputs read: last_row moves up, dead values go
      {"fuse", run_fuse, true},           // rms_norm prologue, glu, rope/kv_store/residual epilogues into matmuls
      {"tile", run_tile, false},          // each op -> OpDesc + grid of column-tile instructions; buffers
      {"deps", run_deps, false},          // counters and waits from read/write regions, transitively reduced
      {"memplan", run_memplan, false},    // arena offsets with liveness reuse ordered by waits; KV storage
      {"schedule", run_schedule, false},  // critical-path global order; static per-worker lists
      {"validate", run_validate, false},  // the validator: order, counts, races, coverage
  };
  return passes;
}

namespace {
bool print_after(const std::string& pass) {
  const char* env = std::getenv("MK_PRINT_AFTER");
  if (!env) return false;
  std::string s = std::string(",") + env + ",";
  return s == ",all," || s.find("," + pass + ",") != std::string::npos;
}

// MK_PRINT_AFTER names passes (comma-separated) or is "all": a name that is no pass is an error
// naming the variable (it printed nothing, without a word).
void check_print_after() {
  const char* env = std::getenv("MK_PRINT_AFTER");
  if (!env || std::string(env) == "all") return;
  std::string names;
  for (const Pass& p : default_pipeline()) names += (names.empty() ? "" : ", ") + p.name;
  const std::string list = env;
  for (size_t from = 0; from <= list.size();) {
    const size_t comma = std::min(list.find(',', from), list.size());
    const std::string name = list.substr(from, comma - from);
    bool known = false;
    for (const Pass& p : default_pipeline()) known |= p.name == name;
    if (!known) fail("MK_PRINT_AFTER: '{}' is not a pass (the passes: {}; or all)", printable(name), names);
    from = comma + 1;
  }
}
}  // namespace

PassContext run_pipeline(const Graph& graph, const CompileOptions& options, const std::string& stop_after) {
  PassContext cx;
  cx.graph = graph;
  cx.options = options;
  if (cx.options.workers < 1) fail("compile: workers must be at least 1");
  if (cx.options.max_tokens < 1) fail("compile: max_tokens must be at least 1");
  check_print_after();
  if (options.verify) verify_graph(cx.graph);
  const bool time_passes = std::getenv("MK_TIME_PASSES") != nullptr;
  for (const Pass& pass : default_pipeline()) {
    bool skip = false;
    for (const auto& s : options.skip) skip |= s == pass.name;
    if (!skip) {
      try {
        auto t0 = std::chrono::steady_clock::now();
        pass.run(cx);
        if (time_passes)
          std::fprintf(stderr, "pass %s: %.1f ms\n", pass.name.c_str(),
                       std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        if (options.verify) {
          if (pass.on_graph)
            verify_graph(cx.graph);
          else
            verify_program_structure(cx.program);
        }
      } catch (const Error& e) {
        fail("pass {}: {}", pass.name, e.what());
      }
      if (print_after(pass.name))
        std::cerr << "// after " << pass.name << "\n" << (pass.on_graph ? cx.graph.str() : cx.program.str());
    }
    if (pass.name == stop_after) break;
  }
  return cx;
}

namespace {
std::atomic<uint64_t> g_compiled{0};
}  // namespace

uint64_t programs_compiled() { return g_compiled.load(); }

Program compile_program(const Graph& graph, const CompileOptions& options) {
  g_compiled.fetch_add(1);
  for (const auto& s : options.skip)
    if (s == "tile" || s == "deps" || s == "memplan" || s == "schedule" || s == "validate")
      fail("compile: pass {} cannot be skipped", s);
  return std::move(run_pipeline(graph, options).program);
}

}  // namespace mk
