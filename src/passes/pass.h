// The compiler: passes over the Graph (dce, fuse) then over the Program (tile, deps, memplan,
// schedule, validate). default_pipeline() in pipeline.cpp lists them in order, one line each.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "isa/program.h"

namespace mk {

struct CompileOptions {
  int workers = 1;                   // tiles and static lists are sized for this many workers
  int64_t max_tokens = 256;          // bound on n_tokens per step; buffers are sized for it
  ScheduleKind schedule = ScheduleKind::dynamic;
  int64_t tile_bytes = 192 * 1024;   // target weight bytes per matmul tile
  int tiles_per_worker = 2;          // at least workers * this tiles per op when its width allows
  // Matmuls whose output RoPE or attention reads are tiled in whole heads (the tiling before
  // 2026-12-06). Off: only rotated-halves RoPE needs whole heads; adjacent-pair RoPE and the values
  // attention reads are tiled like any matmul (16 columns), where head_dim is a multiple of 16, so
  // that a 1B's q/k/v spread over more than its 48 heads' worth of SMs.
  bool head_tiles = false;
  // Flash-decoding: each row's cached positions are cut into this many ranges (attention_partial
  // tiles = n_head_kv x attn_splits, then attention_combine). 1 = one attention op (no split);
  // 0 = auto: ceil(workers / n_head_kv), so the tiles cover the workers. Capped at 64 and n_ctx.
  int64_t attn_splits = 1;
  // Attention tiles over a part of the rows too (Instr::row_parts; each row's attention is
  // independent, so the bits do not change): >= 1 = that many parts; 0 = auto: 1, unless the KV-group
  // tiles keep under 90% of the workers busy (tiles / (workers x rounds of tiles): SmolLM2's 3 KV
  // groups on 2 workers, 75%) and are fewer than 4 per worker, then the fewest parts (at most 8 and
  // max_tokens) that reach 90% (SmolLM2, 2 workers: 2). Tiles are emitted part-major (every column
  // tile of part 0, then of part 1, ...), so that a one-row step's work sits in the last part.
  int64_t attn_row_parts = 0;
  // RMS statistic once per op (GPU backends): the op writing a pro_rms matmul's x also writes its
  // tiles' per-row sums of squares (OpDesc::ss_out), and the matmul's tiles sum those partials
  // instead of re-reading and squaring the row. Adds buffers, no waits (the matmul already waits for
  // every tile of that op). Backends that ignore the slots (cpu) keep the option off.
  bool rms_partials = false;
  // The backend's limit on a matmul tile's output columns for rows of k elements of weight type w
  // (CUDA: what fits its shared memory, cuda::max_matmul_tile_cols); empty = none. Tiles are
  // narrowed to it (in whole alignment units) whatever tile_bytes and tiles_per_worker ask for.
  std::function<int64_t(DType w, int64_t k)> max_matmul_cols;
  std::vector<std::string> skip;     // pass names not to run (e.g. {"fuse"} to compare against)
  bool verify = true;                // verify the IR / program after every pass
};

struct PassContext {
  Graph graph;
  Program program;
  CompileOptions options;
  bool lowered = false;  // true once `tile` has turned the graph into a program
};

struct Pass {
  std::string name;
  void (*run)(PassContext&);
  bool on_graph;  // graph-level (true) or program-level (false)
};

// Every pass, in order.
const std::vector<Pass>& default_pipeline();

// Runs the pipeline on `graph`; `stop_after` (a pass name) ends early. With MK_PRINT_AFTER=all or a
// comma list of pass names, prints the IR/program after those passes to stderr. Throws mk::Error
// naming the pass when a pass or the verifier fails.
PassContext run_pipeline(const Graph& graph, const CompileOptions& options, const std::string& stop_after = "");
Program compile_program(const Graph& graph, const CompileOptions& options);
// How many programs compile_program has produced in this process (tests check that a generation
// compiles once).
uint64_t programs_compiled();

// Individual passes (each in its own file).
void run_dce(PassContext& cx);
void run_fuse(PassContext& cx);
void run_tile(PassContext& cx);
void run_deps(PassContext& cx);
void run_memplan(PassContext& cx);
void run_schedule(PassContext& cx);
void run_validate(PassContext& cx);

// Structural checks of a program after any program pass: ids in range, tiles inside their ops.
void verify_program_structure(const Program& p);

// The validator (validate.cpp): every property ARCHITECTURE.md lists. Returns the problems found
// (empty = valid); validate_program throws mk::Error with them.
std::vector<std::string> check_program(const Program& p);
void validate_program(const Program& p);

}  // namespace mk
