// Program -> one CUDA C++ source: the persistent megakernel and the per-op baseline kernels.
//
// The source is the fixed device text (device/abi.cuh, ptx.cuh, quant.cuh, prelude.cuh: ABI structs,
// memory helpers, the ggml block types of weights, one template per opcode) followed by, per Program:
//   - one config struct and one __device__ function per distinct op *signature*: shapes, strides,
//     tile width, dtypes and constants (eps, scale, RoPE frequencies) baked in as constexpr. Ops
//     that differ only in their operands (the same projection in every layer) share a function;
//     operand pointers come from the op table (MkOpArgs) at run time;
//   - mk_dispatch: a switch from the instruction's function index to those functions;
//   - mk_megakernel (device/interpreter.cuh): the interpreter. Grid = co-resident blocks. Each block takes instructions from
//     its static list or the global queue (fetch pipelined: thread 0 claims the next index while
//     the current instruction waits and runs), prefetches the instruction's weights into L2, thread
//     0 waits on its counters (ld.acquire.gpu, bounded by timeout_ns; on timeout the error record
//     names instruction, counter, value and target and every block stops), the block runs the
//     function, then thread 0 signals (fence + red.release.gpu).
//   - mk_perop_<f> (unless perop_kernels is off): one kernel per function for the baselines: block b runs the b-th instruction
//     of one op (op_instrs), no waits or signals: kernel boundaries order the ops.
// Only runtime symbols (n_tokens, n_out) and the epoch are kernel parameters; per-row positions, KV
// slots and block tables are step inputs in the arena (isa/program.h), read through MkOpArgs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "isa/program.h"
#include "passes/pass.h"

namespace mk::cuda {

// Host mirrors of the device ABI (layouts asserted equal in codegen.cpp and in the device source).
struct MkInstr {
  int32_t op, fn, c0, c1, signal, wait_begin, n_waits, rows;  // rows: row part | row parts << 16
};
struct MkWait {
  int32_t counter;
  uint32_t count, per_step, pad;
};
struct MkOpArgs {
  uint64_t out, x, y, z, res, pos, ids, w, w_up, norm_w, bias, tab;  // device pointers (abi.cuh: step inputs)
  uint64_t ss, ss_out;  // RMS statistic partials (isa/program.h OpDesc::ss, ss_out)
};
struct MkError {
  uint32_t flag;
  int32_t kind, instr, counter;
  uint32_t value, target;
  int32_t block;
  uint32_t epoch;
};
struct MkSym {
  int32_t n_tokens, n_out;
  int32_t want_topk, pad;  // 0: the caller reads no topk output this step (the op's tiles only signal)
};
struct MkParams {
  uint64_t instrs, waits, list_offsets, list_items, op_instrs, ops, counters, queue, error, abort_flag, sym_dev;
  uint64_t trace;  // MK_TRACE sources: per-block counts (padded to 256 bytes), then MkTraceRec[grid][instrs]
  uint64_t timeout_ns;
  MkSym sym;
  uint32_t epoch, pad;
};
static_assert(sizeof(MkInstr) == 32 && sizeof(MkWait) == 16 && sizeof(MkOpArgs) == 112 && sizeof(MkError) == 32 &&
              sizeof(MkParams) == 128);
struct MkTraceRec {  // one executed instruction (globaltimer ns)
  int32_t instr;
  uint32_t smid;
  uint64_t wait_ns, start_ns, end_ns;
};
static_assert(sizeof(MkTraceRec) == 32);

struct CudaCodegenOptions {
  int threads = 512;                // threads per block (a multiple of 32)
  int64_t max_smem_bytes = 200 * 1024;  // dynamic shared memory budget per block (H100/H200: 227 KB)
  // Element type each weight has on the device, indexed like Program::weights; empty = the
  // program's. Matmul and embedding weights may be any ggml block type of device/quant.cuh (rows
  // device_row_bytes apart); norm and bias vectors f32/f16/bf16.
  std::vector<DType> weight_dtypes;
  bool trace = false;  // MK_TRACE: the megakernel records a globaltimer trace (see MkTraceRec)
  // Emit the per-op baseline kernels (cuda-perop, cuda-graph). Off for the megakernel alone: they
  // roughly double NVRTC time, since each inlines its op's function again.
  bool perop_kernels = true;
  // MK_PRELOAD (interpreter.cuh): the next instruction's descriptor is copied to shared memory while
  // this one runs. MK_CLAIM_AHEAD: the dynamic queue's next claim before the current instruction's
  // wait (the first GPU run's loop) instead of after it. MK_WEIGHT_EVICT_FIRST (ptx.cuh): weight
  // loads carry an L2 evict-first policy. apply_env sets them from MK_CUDA_PRELOAD,
  // MK_CUDA_CLAIM_AHEAD and MK_CUDA_EVICT_FIRST.
  bool preload = true;
  bool claim_ahead = false;
  bool weight_evict_first = false;
};

struct CudaSource {
  std::string code;
  int threads = 0;
  size_t smem_bytes = 0;           // dynamic shared memory per block
  std::vector<int> op_function;    // op index -> function index
  int n_functions = 0;
  std::string kernel_name = "mk_megakernel";
  // Per-op baseline kernel of function f: fmt::format("mk_perop_{}", f).
};

// The widest matmul tile (output columns) whose staged activation row and output row fit
// `max_smem_bytes` of shared memory per block (mk_matmul's layout, one row block) for rows of k
// elements of weight type w; 0 when not even one column fits. The CUDA backends give it to the tile
// pass (CompileOptions::max_matmul_cols), so that wide tiles (MK_CUDA_TILES_PER_WORKER=1, few
// blocks) are split to fit rather than refused by the code generator.
int64_t max_matmul_tile_cols(DType w, int64_t k, int64_t max_smem_bytes, int threads);
// Sets co.max_matmul_cols to that cap for blocks of `threads` threads and max_smem_bytes.
void apply_device_limits(CompileOptions& co, int64_t max_smem_bytes, int threads);

// Generates the source. Throws mk::Error for what the CUDA backend cannot run (an unsupported weight
// type, a shape the templates do not handle), naming the op.
CudaSource generate_cuda(const Program& p, const CudaCodegenOptions& options = {});

// The device-side tables the kernels read, in the ABI layout (fn indices from `src`).
struct DeviceTables {
  std::vector<MkInstr> instrs;
  std::vector<MkWait> waits;
  std::vector<int32_t> list_offsets, list_items;  // static schedules; empty for dynamic
  std::vector<int32_t> op_instrs;                 // instruction indices grouped by op
  std::vector<int32_t> op_first, op_count;        // per op: its range in op_instrs
  std::vector<int32_t> launch_order;              // ops in an order that respects dependencies
};
DeviceTables build_device_tables(const Program& p, const CudaSource& src);

// Element type each weight has on the device: the program's (quantized types stay in their ggml
// blocks). What the backend passes as CudaCodegenOptions::weight_dtypes.
std::vector<DType> device_weight_dtypes(const Program& p);

// The development knobs of the CUDA backends from the environment, for the backend and for
// `compile --emit cuda` alike: MK_CUDA_TILE_BYTES / MK_CUDA_TILES_PER_WORKER / MK_CUDA_HEAD_TILES
// (CompileOptions' tile_bytes / tiles_per_worker / head_tiles), MK_CUDA_PRELOAD / MK_CUDA_CLAIM_AHEAD / MK_CUDA_EVICT_FIRST
// (preload, claim_ahead, weight_evict_first). Unset variables keep the options' values; a value
// that is not a whole number in range (tile bytes 1..2^40, tiles per worker 1..1024, flags 0 or 1)
// throws mk::Error naming the variable (support/env.h).
void apply_env(CompileOptions& co);
void apply_env(CudaCodegenOptions& cg);
// Bytes from one row of a weight matrix (rows of row_elems elements, the GGUF ne[0]) to the next on
// the device: dtype_bytes for f32/f16/bf16; for the ggml block types the row's raw blocks rounded up
// to a multiple of 16 bytes (so that the device reads whole 16-byte chunks, device/quant.cuh). The
// backend uploads quantized tensors row by row at this stride, with 256 bytes of slack at the end.
int64_t device_row_bytes(DType t, int64_t row_elems);

// Development aid for the watchdog check (MK_DEBUG_BREAK_WAIT=1 in the cuda backend): makes one
// wait impossible to satisfy by asking for one signal more than its counter gets per step (the
// last instruction in the global order that waits). The kernel must then end with the watchdog
// error instead of hanging. (Dropping a wait instead would make a race, not a hang.) Returns the
// instruction index, or -1 when no instruction waits. The result no longer passes the validator.
int break_one_wait(Program& p);

// The device sources (src/backend/cuda/device/*.cuh, embedded at build time by cmake/embed_text.cmake):
// abi.cuh (structs shared with the host), ptx.cuh (inline PTX behind named wrappers), quant.cuh
// (ggml block types, dequantized in registers), prelude.cuh
// (helpers, one template per opcode), interpreter.cuh (the persistent kernel), and emu_host.h (the
// host versions of the wrappers, prepended when cuda-emu compiles the source for the CPU).
namespace text {
extern const char* const abi;
extern const char* const ptx;
extern const char* const quant;
extern const char* const prelude;
extern const char* const interpreter;
extern const char* const emu_host;
}  // namespace text

}  // namespace mk::cuda
