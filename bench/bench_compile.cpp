// Host compile time of the real shapes for an H100/H200 (132 workers, the cuda backend's default
// grid): open the model from shapes alone, build the graph, run every pass (dce .. validate, with
// the verifier after each, as the backends do). Target (issue 8): 8B <= 10 s cold.
// Run: build/bench/mk_bench --benchmark_filter=Compile
// MK_TIME_PASSES=1 prints each pass's time on stderr.
#include <benchmark/benchmark.h>

#include <string>

#include "archs/arch.h"
#include "passes/pass.h"
#include "runtime/session.h"

using namespace mk;

namespace {

void BM_Compile(benchmark::State& state, const std::string& path) {
  size_t n_instrs = 0;
  for (auto _ : state) {
    ModelFile model = open_model(path, /*with_data=*/false);
    Graph g = build_graph(model, BuildOptions{4096, false});
    CompileOptions co;
    co.workers = 132;
    Program p = compile_program(g, co);
    n_instrs = p.instrs.size();
    benchmark::DoNotOptimize(p.arena_bytes);
  }
  state.counters["instructions"] = static_cast<double>(n_instrs);
}

}  // namespace

BENCHMARK_CAPTURE(BM_Compile, llama3_2_1b, std::string("synth:llama3.2-1b"))->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Compile, llama3_1_8b, std::string("synth:llama3.1-8b"))->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(2);
