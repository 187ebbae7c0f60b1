// Program -> one CUDA C++ source: the persistent megakernel and the per-op baseline kernels.
//
// The source is the fixed prelude (device_prelude.cpp: ABI structs, memory helpers, one template
// per opcode) followed by, per Program:
//   - one config struct and one __device__ function per distinct op *signature*: shapes, strides,
//     tile width, dtypes and constants (eps, scale, RoPE frequencies) baked in as constexpr. Ops
//     that differ only in their operands (the same projection in every layer) share a function;
//     operand pointers come from the op table (MkOpArgs) at run time;
//   - mk_dispatch: a switch from the instruction's function index to those functions;
//   - mk_megakernel: the interpreter. Grid = co-resident blocks. Each block takes instructions from
//     its static list or the global queue (fetch pipelined: thread 0 claims the next index while
//     the current instruction waits and runs), prefetches the instruction's weights into L2, thread
//     0 waits on its counters (ld.acquire.gpu, bounded by timeout_ns; on timeout the error record
//     names instruction, counter, value and target and every block stops), the block runs the
//     function, then thread 0 signals (fence + red.release.gpu).
//   - mk_perop_<f>: one kernel per function for the baselines: block b runs the b-th instruction
//     of one op (op_instrs), no waits or signals: kernel boundaries order the ops.
// Only runtime symbols (n_tokens, n_past) and the epoch are kernel parameters.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "isa/program.h"

namespace mk::cuda {

// Host mirrors of the device ABI (layouts asserted equal in codegen.cpp and in the device source).
struct MkInstr {
  int32_t op, fn, c0, c1, signal, wait_begin, n_waits, pad;
};
struct MkWait {
  int32_t counter;
  uint32_t count, per_step, pad;
};
struct MkOpArgs {
  uint64_t out, x, y, z, res, pos, ids, w, w_up, norm_w, bias, pad;  // device pointers
};
struct MkError {
  uint32_t flag;
  int32_t kind, instr, counter;
  uint32_t value, target;
  int32_t block;
  uint32_t epoch;
};
struct MkSym {
  int32_t n_tokens, n_past;
};
struct MkParams {
  uint64_t instrs, waits, list_offsets, list_items, op_instrs, ops, counters, queue, error, abort_flag, sym_dev;
  uint64_t timeout_ns;
  MkSym sym;
  uint32_t epoch, pad;
};
static_assert(sizeof(MkInstr) == 32 && sizeof(MkWait) == 16 && sizeof(MkOpArgs) == 96 && sizeof(MkError) == 32 &&
              sizeof(MkParams) == 112);

struct CudaCodegenOptions {
  int threads = 512;                // threads per block (a multiple of 32)
  int64_t max_smem_bytes = 200 * 1024;  // dynamic shared memory budget per block (H100/H200: 227 KB)
  // Element type each weight has on the device, indexed like Program::weights; empty = the
  // program's. Q8_0 weights must be given as F32 (the backend converts them on upload).
  std::vector<DType> weight_dtypes;
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

extern const char* const kDevicePrelude;

}  // namespace mk::cuda
