// ---- abi.cuh: types and structs shared with the host ------------------------------------------
// (src/backend/cuda/device/*.cuh, concatenated by codegen.cpp into one self-contained source:
// abi.cuh, ptx.cuh, prelude.cuh, the generated op functions, interpreter.cuh.)
typedef unsigned int mk_u32;
typedef unsigned long long mk_u64;
typedef long long mk_i64;

// ABI shared with the host (backend/cuda/codegen.h mirrors these; sizes asserted on both sides).
struct MkInstr {   // one tile of one op
  int op;          // index into the op table
  int fn;          // device function (op signature) index
  int c0, c1;      // output columns [c0, c1)
  int signal;      // counter to increment when done, -1 = none
  int wait_begin;  // first MkWait of this instruction
  int n_waits;
  int rows;        // row part | row parts << 16 (isa/program.h instr_rows; attention only, else 0 | 1 << 16)
};
struct MkWait {
  int counter;
  mk_u32 count;      // signals of this step to wait for
  mk_u32 per_step;   // the counter's signals per step (diagnostics; the wait target is epoch * count)
  mk_u32 pad;
};
// Device pointers of one op's operands (null when unused). The step inputs of a ragged batch
// (isa/program.h) ride in the int slots: pos = positions (rope, matmul RoPE, attention); ids = the
// token ids (embed), kv_slot (kv_store, matmul store), row_seq (attention), logit_rows (last_row);
// tab = block_table (attention).
struct MkOpArgs {
  float* out;
  const float* x;
  const float* y;
  const float* z;
  const float* res;
  const int* pos;
  const int* ids;
  const void* w;
  const void* w_up;
  const void* norm_w;
  const void* bias;
  const int* tab;
  const float* ss;  // pro_rms matmul: per-row partial sums of squares of x (isa/program.h OpDesc::ss)
  float* ss_out;    // writer of such an x: this tile's partials go to columns [2t, 2t + 2)
};
struct MkError {   // first failure wins; read by the host after each step
  mk_u32 flag;     // 0 = none
  int kind;        // 1 = wait timeout, 2 = token id out of range
  int instr;       // instruction index
  int counter;     // counter waited on (kind 1) / the bad id (kind 2)
  mk_u32 value;    // counter value seen (kind 1) / the table rows (kind 2)
  mk_u32 target;   // value waited for (kind 1)
  int block;
  mk_u32 epoch;
};
struct MkSym {
  int n_tokens;   // rows of this step
  int n_out;      // rows whose logits it returns
  int want_topk;  // 0: the caller reads no topk output this step (mk_topk returns at once)
  int pad;
};
struct MkParams {
  const MkInstr* instrs;
  const MkWait* waits;
  const int* list_offsets;   // static schedule: [gridDim.x + 1]
  const int* list_items;     // static schedule: instruction indices per block
  const int* op_instrs;      // per-op baselines: instruction indices grouped by op
  const MkOpArgs* ops;
  mk_u32* counters;
  mk_u64* queue;             // dynamic schedule: global claim index (epoch-relative, never reset)
  MkError* error;            // host-mapped
  volatile mk_u32* abort_flag;
  const MkSym* sym_dev;      // per-op baselines read the symbols here (graph replay)
  char* trace;               // MK_TRACE: per-block record counts, then MkTraceRec[gridDim.x][MK_NUM_INSTRS]
  mk_u64 timeout_ns;         // bound on one counter wait
  MkSym sym;                 // megakernel: symbols of this step
  mk_u32 epoch;              // step number, 1, 2, ...
  mk_u32 pad;
};
static_assert(sizeof(MkInstr) == 32, "MkInstr ABI");
static_assert(sizeof(MkWait) == 16, "MkWait ABI");
static_assert(sizeof(MkOpArgs) == 112, "MkOpArgs ABI");
static_assert(sizeof(MkError) == 32, "MkError ABI");
static_assert(sizeof(MkParams) == 128, "MkParams ABI");

#define MK_WARPS (MK_THREADS / 32)
#define MK_NEG_INF (__int_as_float(0xff800000))
