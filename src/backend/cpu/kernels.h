// Tile implementations of every opcode for the CPU interpreter: plain C++ written for the compiler
// to vectorise, except the float32 matmul of 4 rows or more, which runs register-blocked tiles with a
// run-time ISA (float_gemm.h) that keep dot()'s per-element arithmetic. Determinism rule: the arithmetic producing one output element depends only on the
// element (row, column), never on the tile bounds or the worker, so every tiling, worker count and
// schedule gives the same bits. Reductions use 16 fixed lanes combined in a fixed tree.
#pragma once
#include <atomic>
#include <cstdint>
#if defined(__F16C__)
#include <immintrin.h>
#endif
#include <vector>

#include "isa/program.h"
#include "quant/quant.h"

namespace mk::cpu {

// A weight bound to model data: rows of `row_elems` elements, `row_bytes` apart. Quantized weights
// stay in their blocks; matmul reads them block by block through `quant` (src/quant/).
struct WeightRef {
  DType dtype = DType::F32;
  const quant::QuantType* quant = nullptr;  // set for the ggml block types
  const uint8_t* data = nullptr;
  int64_t row_elems = 0;
  size_t row_bytes = 0;
  const float* f32 = nullptr;  // set when the data is float32 and aligned (no conversion needed)
  // Matmuls over this weight quantize the activation rows to quant->act blocks and use
  // quant->dot_act, as llama.cpp's CPU backend does (set for types with an act when the backend's
  // act_quant option is on); otherwise activations stay float32.
  bool act_q8 = false;
  // act_q8 weights of the types with QuantType::pack, where quant::gemm_packed_available(): the
  // matrix packed for the 16-row tiles (packed_group_bytes per 16 rows), read by matmul's tiles that
  // start at a multiple of 16 rows instead of `data` (which embedding lookups still read).
  const uint8_t* packed = nullptr;
  size_t packed_group_bytes = 0;
};

// A spin-wait's pause (x86 PAUSE; nothing elsewhere).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// One shared activation slot (StepMemory::act_shared): the quantized rows of a matmul op's act_cache
// key, prepared once per step by every worker that runs a tile of those ops, each claiming chunks of
// rows (claim), the last of them completing `done`; then all read the same rows. Both counters hold
// (tag << 16) | count, tag = the step and the key's number, so a new step or key starts from zero
// without a reset.
struct alignas(64) ActShared {
  std::atomic<uint64_t> claim{0};
  alignas(64) std::atomic<uint64_t> done{0};
  uint8_t* rows = nullptr;  // act_cache_floats() floats
};

// Memory and symbols one step sees.
struct StepMemory {
  uint8_t* arena = nullptr;
  uint8_t* kv = nullptr;
  const WeightRef* weights = nullptr;
  SymValues sym;
  // llama.cpp's default f16 KV cache (and its non-flash attention): K and V rows are stored as IEEE
  // halves (a KV buffer's element i is half i from byte offset / 2 of the kv region, which is then
  // kv_bytes / 2 long: half the memory and half the bytes attention reads), the query is rounded to
  // f16 before Q.K, and the normalised attention probabilities to f16 before they weight V.
  bool kv_f16 = false;
  // This worker's cache of a matmul op's activation rows, quantized to 8-bit blocks (act_q8) or, for
  // float32 activations, RMS-normalised (an RMS prologue) (act_cache_floats floats; nullptr: none),
  // valid for one (step, act_key): every tile of an op reads the same rows, so the worker that runs
  // several of its tiles (or of ops sharing its key) quantizes or normalises them once.
  float* act_cache = nullptr;
  // Per op, the op whose prepared activation rows it shares in act_cache (act_cache_keys(): q, k and
  // v read the same normalised rows, so a worker prepares them once for the three); nullptr: each
  // op its own.
  const int32_t* act_key = nullptr;
  // Per op, its act_key's slot in act_shared (act_shared_slots()), or -1: the worker prepares the
  // rows itself (act_cache). nullptr: no sharing.
  const int32_t* act_slot = nullptr;
  ActShared* act_shared = nullptr;
  uint32_t step = 0;  // the step's number, > 0 and different for every step of an interpreter
  // false: the step's caller reads no `topk` output (plain logits or greedy ids), so the topk op's
  // tiles only signal (its output is left as it was); saves a pass over every logits row.
  bool want_topk = true;
  // llama.cpp's GELU (ggml-cpu GGML_GELU_FP16, the default): x rounded to f16 and looked up in a
  // table of f16(ggml_gelu_f32(x)); 0 for x <= -10, x for x >= 10. With act_quant (llama.cpp's
  // numerics); else the tanh formula in float (transformers' gelu_pytorch_tanh).
  bool gelu_f16 = false;
};

// v rounded to the nearest IEEE half (ties to even), as float.
inline float round_f16(float v) {
#if defined(__F16C__)
  return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
#else
  return f16_to_f32(f32_to_f16(v));
#endif
}

// x[0, n) as IEEE halves (round to nearest even: round_f16's bits) into h, and halves back to float
// (f16_to_f32_row). The f16 KV cache stores its rows this way (StepMemory::kv_f16).
inline void f32_to_f16_span(const float* x, uint16_t* h, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) h[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
#else
  for (; i < n; ++i) h[i] = f32_to_f16(x[i]);
#endif
}

inline void f16_to_f32_span(const uint16_t* h, float* x, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) x[i] = _cvtsh_ss(h[i]);
#else
  for (; i < n; ++i) x[i] = f16_to_f32(h[i]);
#endif
}

// Per-worker scratch space, sized by scratch_floats().
size_t scratch_floats(const Program& p);
// Per-worker floats for StepMemory::act_cache.
size_t act_cache_floats(const Program& p);
// StepMemory::act_key for program p over `weights` (the interpreter's): op i shares op j's entry
// (j < i, both matmuls) when they prepare the same rows: the same x, rows, K, RMS prologue (norm
// weight, eps, offset) and activation quantization (act_q8 and its block types), and no op between
// them writes x. Every other op maps to itself.
std::vector<int32_t> act_cache_keys(const Program& p, const WeightRef* weights);
// StepMemory::act_slot: the keys of act_q8 matmuls in op order take slots 0, 1, .., n_slots - 1, 0, ..
// A key reuses a slot only if every instruction of its ops waits, directly or through others, for
// every instruction of the ops of the slot's previous key (so nobody still reads the old rows);
// otherwise it gets no slot (-1). All -1 for a one-worker program.
std::vector<int32_t> act_shared_slots(const Program& p, const WeightRef* weights, const std::vector<int32_t>& keys,
                                      int n_slots);

void execute(const Program& p, const Instr& in, const StepMemory& m, float* scratch);

// Whether attention over an f16 KV cache may take its AVX-512 path (kernels.cpp attention_f16: the
// same bits as the portable one, K and V converted in registers). On by default where the build
// targets AVX-512; tests turn it off to compare the two. Process-wide; set it between steps.
void set_attention_avx512(bool on);
bool attention_avx512_enabled();

}  // namespace mk::cpu
