// The instruction program: what the passes produce and every backend executes.
//
// A Program is
//   - a weight table (names, dtypes and shapes of the model tensors instructions read),
//   - buffers: activations and inputs live in one byte arena (offsets from the memory planner,
//     reused by liveness), KV caches in a separate persistent storage,
//   - an op table: one OpDesc per fused op with its static parameters (shapes, constants, operand
//     slots) — what a code generator bakes into one specialised device function,
//   - instructions in one global topological order (the dynamic queue order): each is one tile of
//     one op with the counters it waits on and the counter it signals,
//   - counters with their signals per step, and optional static per-worker lists.
//
// Epochs: counters only grow. In step e (1, 2, ...) a wait {counter, count} is satisfied when the
// counter has reached (e - 1) * signals_per_step + count; a valid program has count ==
// signals_per_step, i.e. "all of this step's signals". Nothing is reset between steps.
//
// The text form (str()) is deterministic: golden tests and `compile --emit program` print it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/sym.h"
#include "model/dtype.h"

namespace mk {

enum class Opcode : uint8_t {
#define MK_OPCODE(name, summary) name,
#include "isa/instr.def"
#undef MK_OPCODE
};
constexpr int kNumOpcodes = 0
#define MK_OPCODE(name, summary) +1
#include "isa/instr.def"
#undef MK_OPCODE
    ;
std::string_view opcode_name(Opcode op);
std::string_view opcode_summary(Opcode op);

struct ProgramWeight {
  std::string name;  // tensor name in the model file
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
};

enum class BufferKind : uint8_t {
  input,       // written by the host before each step (tokens, positions); pinned in the arena
  activation,  // written by instructions; arena offset shared by liveness
  kv,          // KV cache: persistent across steps, separate storage
};
std::string_view buffer_kind_name(BufferKind k);

struct Buffer {
  std::string name;
  BufferKind kind = BufferKind::activation;
  DType dtype = DType::F32;  // F32, or I32 for inputs
  SymExpr rows;              // rows this step (n_tokens, 1, or n_ctx for caches)
  int64_t max_rows = 0;      // rows at the compile-time bound (sizes the allocation)
  int64_t cols = 0;          // row stride in elements
  int64_t offset = -1;       // bytes into the arena (input/activation) or the KV storage (kv)
  bool is_output = false;    // read by the host after the step: live until the end
  int64_t bytes() const { return max_rows * cols * 4; }
};

enum class Act : uint8_t { none, silu, gelu, gelu_tanh };
enum class Epi : uint8_t { none, add, rope, store, rope_store };
std::string_view act_name(Act a);
std::string_view epi_name(Epi e);

// One fused op: the static parameters all of its instructions share. Slots are buffer ids (x, y,
// z, pos, ids, res, cache, out) or weight ids (w, w_up, norm_w, bias); -1 when unused.
struct OpDesc {
  Opcode opcode = Opcode::matmul;
  std::string name;  // the graph value's name ("blk.3.q"), or "%12"
  int layer = -1;
  int node = -1;     // graph value id it came from
  SymExpr rows;      // output rows
  int64_t cols = 0;  // output columns (the tiled dimension)
  int64_t k = 0;     // reduction length (matmul: x columns; norms: row length)
  int out = -1, x = -1, y = -1, z = -1, pos = -1, ids = -1, res = -1;
  // RMS statistic partials (CompileOptions::rms_partials): ss_out on the op that writes a matmul's
  // pro_rms x: tile t writes, per row, the sum of squares of its output columns as a float pair
  // (hi, lo: hi = (float)s, lo = (float)(s - hi) of the double s) into columns [2t, 2t + 2); ss on the
  // pro_rms matmul: reads all of them and sums them in tile order instead of re-reading its x row.
  int ss_out = -1, ss = -1;
  int w = -1, w_up = -1, norm_w = -1, bias = -1;
  bool pro_rms = false;  // matmul: rms_norm prologue
  Act glu = Act::none;   // matmul: act(x@w) * (x@w_up)
  Epi epi = Epi::none;   // matmul epilogue
  double eps = 0, weight_offset = 0, scale = 1;  // norms; scale op / attention scale
  int64_t group = 0;                             // rms_norm group (columns per statistic)
  int64_t head_dim = 0, n_rot = 0, n_head = 0, n_head_kv = 0;
  double softcap = 0;  // softcap op: the cap; attention: scores s -> softcap * tanh(s / softcap) (0 = none)
  int64_t window = 0;  // attention: sliding window (0 = none), row r reads [max(0, pos[r] - window + 1), pos[r]]
  int64_t attn_splits = 1;  // attention_partial/_combine: ranges each row's cached positions are cut into
  bool rope_halves = false;
  double theta = 0;              // for listings; the numerics use inv_freq
  std::vector<double> inv_freq;  // RoPE inverse frequencies, n_rot / 2 of them
  int64_t tile_cols = 0;         // the tile width the tiling pass chose
  // Mixture of experts: moe_route: n_expert_used = k, moe_norm; moe_matmul: w is [n_expert, n, K]
  // (n = w_rows), y the route [rows, 2k], `k` x's columns; moe_reduce: x is [rows, k K] and out
  // [rows, n] the weighted sum over slots, else x is [rows, K], out [rows, k n].
  int64_t n_expert = 0, n_expert_used = 0, w_rows = 0;
  bool moe_reduce = false, moe_norm = false;
};

// Flash-decoding scratch (attention_partial -> attention_combine): per row, per KV group g, per
// split s, per head of the group, head_dim unnormalised outputs o, then the range's max score m and
// sum l. Groups-major so that one (group, split) tile writes one contiguous column range.
inline int64_t attn_partial_stride(const OpDesc& o) { return o.head_dim + 2; }  // floats per (head, split)
inline int64_t attn_partial_tile_cols(const OpDesc& o) { return (o.n_head / o.n_head_kv) * attn_partial_stride(o); }
// Positions [lo, hi) of split s of the range [begin, end) cut into `splits` near-equal contiguous
// parts (empty when end - begin < splits for some s). Every backend cuts them this way.
inline void attn_split_range(int64_t begin, int64_t end, int64_t s, int64_t splits, int64_t* lo, int64_t* hi) {
  const int64_t n = end - begin;
  *lo = begin + n * s / splits;
  *hi = begin + n * (s + 1) / splits;
}

struct Wait {
  int32_t counter = -1;
  uint32_t count = 0;  // signals of this step to wait for (== the counter's signals per step)
  bool operator==(const Wait&) const = default;
};

struct Instr {
  Opcode opcode = Opcode::matmul;
  int32_t op = -1;     // index into Program::ops
  int32_t layer = -1;  // copy of the op's layer (for traces and listings)
  int32_t tile = 0;    // tile coordinate in the op's 1-D grid
  int64_t c0 = 0, c1 = 0;  // output columns of the tile
  // Rows of the tile: part row_part of row_parts of the op's R rows (instr_rows). Only attention
  // tiles take more than one part (the tile pass, CompileOptions::attn_row_parts): each row's
  // attention is independent of the others, so any split gives the same bits.
  int32_t row_part = 0, row_parts = 1;
  std::vector<Wait> waits;
  int32_t signal = -1;  // counter incremented (release) when the tile is done
};

// Rows [lo, hi) of part `part` of `parts` of an op's R rows: near-equal contiguous ranges (empty
// when R < parts for some parts). Every backend cuts them this way.
inline void instr_rows(int64_t R, int64_t part, int64_t parts, int64_t* lo, int64_t* hi) {
  *lo = R * part / parts;
  *hi = R * (part + 1) / parts;
}

struct Counter {
  std::string name;  // "blk.3.q[0:4]": op and tile range that signal it
  uint32_t signals_per_step = 0;
};

enum class ScheduleKind : uint8_t { dynamic, static_rr, static_cp };
std::string_view schedule_name(ScheduleKind k);
ScheduleKind schedule_from_name(std::string_view name);  // "dynamic" | "static-rr" | "static-cp"

struct Program {
  int workers = 1;           // the worker count it was tiled and scheduled for
  int64_t max_tokens = 1;    // bound on n_tokens (rows of a ragged batch) per step (buffers are sized for it)
  int64_t n_ctx = 0;         // positions per sequence (0: no KV cache)
  int64_t kv_block_size = 0;  // paged KV: rows per block (0: no KV cache)
  int64_t kv_pool_rows = 0;   // paged KV: rows of every layer's K and V pool, whole blocks
  std::vector<ProgramWeight> weights;
  std::vector<Buffer> buffers;
  std::vector<OpDesc> ops;
  std::vector<Instr> instrs;  // the global topological order
  std::vector<Counter> counters;
  ScheduleKind schedule = ScheduleKind::dynamic;
  std::vector<std::vector<int32_t>> lists;  // static schedules: instruction indices per worker
  int tokens_buffer = -1, positions_buffer = -1;
  // Per-step i32 inputs of a ragged batch (backend/step_batch.h; -1 when the program has no use):
  // kv_slot[n_tokens]: pool row where each row's K/V goes; row_seq[n_tokens]: each row's sequence
  // (a row of block_table); block_table[max_tokens, max_blocks_per_seq()]: pool blocks of each
  // sequence of the step; logit_rows[n_out]: the rows `last_row` gathers.
  int kv_slot_buffer = -1, row_seq_buffer = -1, block_table_buffer = -1, logit_rows_buffer = -1;
  int64_t max_blocks_per_seq() const { return kv_block_size > 0 ? (n_ctx + kv_block_size - 1) / kv_block_size : 0; }
  std::vector<std::pair<std::string, int>> outputs;  // graph output name -> buffer id
  int64_t arena_bytes = 0, kv_bytes = 0;

  // Full deterministic listing (header, weights, buffers, ops, counters, instructions, schedule).
  std::string str() const;
  // One line per instruction (index, opcode, layer, tile, waits, signal) then a summary.
  std::string listing() const;
  // Instructions per step by opcode, counters, waits, arena and KV bytes.
  std::string summary() const;
  std::string instr_str(int index) const;
  std::string op_str(int index) const;
};

// A memory region one instruction touches: rows [row_lo, row_hi) (symbolic), cols [c0, c1); with
// parts > 1 only the rows of part `part` of that range (instr_rows), so two accesses of one range
// with the same parts and different parts are disjoint.
struct Access {
  int buffer = -1;
  bool write = false;
  SymExpr row_lo, row_hi;
  int64_t c0 = 0, c1 = 0;
  int32_t part = 0, parts = 1;
};

// Regions an instruction reads and writes, derived from its opcode, op slots and tile. The deps
// pass and the validator both use this one definition.
std::vector<Access> instr_accesses(const Program& p, const Instr& in);

// For all n_tokens >= 1 and 1 <= n_out <= n_tokens: a <= b.
bool sym_provably_le(const SymExpr& a, const SymExpr& b);
// Row/column intervals may intersect for some symbol values.
bool accesses_may_overlap(const Access& a, const Access& b);

}  // namespace mk
