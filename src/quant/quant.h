// Quantized weight types: one table entry per ggml block type, each defined in its own file
// (q4_0.cpp, ..., q6_k.cpp).
//
// Block layouts follow the ggml/GGUF type table (ggml/src/ggml-common.h `block_*` structs, the
// `type_traits` table in ggml.c and gguf-py `GGML_QUANT_SIZES`; ids from ggml.h `enum ggml_type`).
// All values are little-endian; "f16" is an IEEE half. QK_K = 256.
//
//   type  id  elems  bytes  layout (byte offsets)                          value of element i
//   q4_0   2    32     18   d:f16@0 qs[16]@2 (low nibbles 0..15, high 16..31) d * (q - 8)
//   q4_1   3    32     20   d:f16@0 m:f16@2 qs[16]@4                        d * q + m
//   q5_0   6    32     22   d:f16@0 qh:u32@2 (bit i = 5th bit) qs[16]@6     d * (q - 16)
//   q5_1   7    32     24   d:f16@0 m:f16@2 qh:u32@4 qs[16]@8               d * q + m
//   q8_0   8    32     34   d:f16@0 qs:i8[32]@2                              d * q
//   q2_K  10   256     84   scales[16]@0 (lo 4 bits scale, hi 4 bits min) qs[64]@16 (2 bits)
//                           d:f16@80 dmin:f16@82                           (d*sc) * q - (dmin*m)
//   q3_K  11   256    110   hmask[32]@0 qs[64]@32 (2 low bits) scales[12]@96 (16 x 6 bits)
//                           d:f16@108                                      (d*(sc-32)) * (q - 4*!hbit)
//   q4_K  12   256    144   d:f16@0 dmin:f16@2 scales[12]@4 (8 x 6-bit scale, 8 x 6-bit min)
//                           qs[128]@16                                     (d*sc) * q - (dmin*m)
//   q5_K  13   256    176   as q4_K, qh[32]@16 (5th bits), qs[128]@48      (d*sc) * q - (dmin*m)
//   q6_K  14   256    210   ql[128]@0 qh[64]@128 scales:i8[16]@192 d:f16@208 (d*sc) * (q - 32)
//   iq4_nl 20   32     18   d:f16@0 qs[16]@2 (nibbles as q4_0)              d * kvalues_iq4nl[q]
//   iq4_xs 23  256    136   d:f16@0 scales_h:u16@2 scales_l[4]@4 qs[128]@8  (d * (ls - 32)) * kvalues_iq4nl[q]
//
// Every product and sum is one float32 operation in the order shown (no fused multiply-add), which
// is what ggml's reference `dequantize_row_*` and gguf-py's `gguf.quants` compute: dequantization is
// bit-exact against both (tests/unit/test_quant.cpp, fixtures from tests/data/quant/).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>

#include "model/dtype.h"

namespace mk {
class ModelFile;
struct WeightTensor;
}

namespace mk::quant {

// An 8-bit activation block type: what llama.cpp's CPU matmul quantizes the activation row to before
// dotting it with quantized weights (ggml-common.h; the weight type's `vec_dot_type` in ggml-cpu.c):
//   q8_0  32 elements in 34 bytes: d:f16@0 qs:i8[32]@2                       (q4_0, q5_0, q8_0 weights)
//   q8_1  32 elements in 36 bytes: d:f16@0 s:f16@2 qs:i8[32]@4, s = d*sum(qs) (q4_1, q5_1 weights)
//   q8_K 256 elements in 292 bytes: d:f32@0 qs:i8[256]@4 bsums:i16[16]@260,       (q2_K .. q6_K)
//        bsums[j] = sum(qs[16 j .. 16 j + 15])
// quantize_row computes what ggml's x86 `quantize_row_q8_0` / `quantize_row_q8_1` (AVX2) compute:
// amax over the block, d = amax / 127 (stored as f16), q = round-to-nearest-even(x * (127 / amax));
// for q8_K what `quantize_row_q8_K_ref` computes: max = the signed element of largest magnitude,
// iscale = -127 / max, q = min(127, round-to-nearest-even(iscale * x)), d = 1 / iscale (f32; a zero
// block has d = 0, q = 0, bsums = 0). Output bytes equal ggml's (tests/data/quant/gen_q8k_fixtures.py).
struct ActQuant {
  std::string_view name;  // "q8_0", "q8_1", "q8_K"
  int64_t block_size;     // elements per block
  int64_t block_bytes;    // bytes per block
  void (*quantize_row)(const float* x, void* dst, int64_t n);  // n a whole number of blocks
};
const ActQuant& act_q8_0();
const ActQuant& act_q8_1();
const ActQuant& act_q8_K();

struct QuantType {
  DType dtype;
  std::string_view name;  // ggml's name: "q4_0", "q4_K", ...
  uint32_t ggml_type;     // ggml.h enum ggml_type, the id in GGUF tensor infos
  int64_t block_size;     // elements per block
  int64_t block_bytes;    // bytes per block
  // dst[0, n) = the n elements (a whole number of blocks) at src.
  void (*dequantize_row)(const void* src, float* dst, int64_t n);
  // Round-to-nearest quantizer (n a whole number of blocks). q4_0..q8_0 compute what ggml's
  // `quantize_row_*_ref` computes; the K-quants use a plain min/max scale per sub-block (no search
  // for the best scale as llama.cpp's quantizer does): valid blocks, somewhat larger error.
  void (*quantize_row)(const float* src, void* dst, int64_t n);
  // sum_i w[i] * x[i] over n elements (whole blocks) of weights w and float32 activations x. Bit
  // for bit the value of dequantize_row followed by a float32 dot in 16 lanes (lane = i mod 16,
  // acc[lane] += x[i] * w[i], lanes combined in the tree (l, l + 8), (l, l + 4), (l, l + 2),
  // (l, l + 1)): the CPU interpreter's dot, so fused and dequantize-then-dot paths agree exactly.
  // Picks, once, the fastest variant this CPU runs (__builtin_cpu_supports): a hand-written AVX2
  // kernel (q4_0, q4_1, q8_0, q4_K, q6_K), else the compiler-vectorised loops (see dot_variants).
  float (*dot)(const void* w, const float* x, int64_t n);
  // The same dot built for each instruction set, indexed by DotIsa (tests call every one the CPU
  // has, see dot_isa_available): all give the same bits.
  float (*dot_variants[3])(const void* w, const float* x, int64_t n);
  // Index of the first of n_blocks blocks whose f16 scale (d, and m/dmin where present) is NaN or
  // infinite, or -1 when all are finite.
  int64_t (*find_bad_scale)(const void* src, int64_t n_blocks);
  // Activation quantization (llama.cpp's arithmetic): `act` is the block type the activation row is
  // quantized to (q8_0 / q8_1 for q4_0 .. q8_0, q8_K for the K-quants; nullptr: activations stay
  // float32) and dot_act the dot of n weights against n quantized activations xq. Per 32-element
  // block, integer products summed in 8 int32 lanes (lane l = elements 4l..4l+3), each lane
  // acc[l] = fma(d_w * d_x, float(sum), acc[l]); the lanes combined as ggml's hsum_float_8 ((l, l + 4),
  // (l, l + 2), (l, l + 1)), plus, for the types with a minimum, sum over blocks of fma(m_w, s_x, .):
  // the bits of ggml's AVX2 ggml_vec_dot_*_q8_* (arch/x86/quants.c): q5_0, q5_1. q4_0, q4_1 and q8_0
  // have block-integer numerics instead (as llama.cpp's repacked x86 kernels): per block the exact
  // int32 dot, then acc = fma(d_w * d_x, float(dot), acc) (q4_1: and summs = fma(m_w, s_x, summs)) in
  // block order, acc (+ summs) (detail::dot_act_blocks_int; gemm_act does it 8 or 16 weight rows per
  // register, blockint_x86.h), which needs a quarter of the float work per multiply-add.
  // The K-quants do the same per
  // 256-element super-block with the sub-block scales inside the integer lanes and the minimum via
  // q8_K's bsums (k_act.h): the bits of ggml_vec_dot_qN_K_q8_K. All variants give the same bits.
  const ActQuant* act = nullptr;
  float (*dot_act)(const void* w, const void* xq, int64_t n) = nullptr;
  float (*dot_act_variants[3])(const void* w, const void* xq, int64_t n) = {};
  // dot_act of one weight row against four activation rows xq[0..3] (out[r]; the same bits as four
  // dot_act calls), unpacking each weight block once: for prefill. nullptr where not written (q4_0,
  // q4_1, q5_0, q5_1, q8_0: their gemm_act serves); the AVX2 kernel on AVX2/AVX-512 machines, else four dot_act calls.
  void (*dot_act4)(const void* w, const void* const* xq, int64_t n, float* out) = nullptr;
  // A tile of dot_act: out[a * ldo + i] = dot_act(w + i * w_stride, xq + a * xq_stride, n) for weight
  // rows i < nw and activation rows a < na (strides in bytes), the same bits as dot_act per pair.
  // Register-blocked (q4_0, q4_1, q8_0: src/quant/blockint_x86.h, one weight row per lane; q5_0, q5_1:
  // src/quant/gemm_x86.h: 4 weight rows x 8 activation rows per pass with AVX-512
  // VNNI, 2 x 4 with AVX2 / AVX-VNNI; src/quant/k_gemm_x86.h for the K-quants: 2 x 4 per pass over
  // q8_K super-blocks, and src/quant/k_gemm_pp.h for q4_K/q5_K/q6_K prefill with AVX-512 VNNI: 2 x up
  // to 16, both weight rows in one register; iq4_nl: src/quant/iq4_nl.cpp, a pair of blocks per
  // register, 4 x 4 or 2 x 8 with AVX-512 VNNI, dot_act4 per weight row with AVX2): for batched decode
  // and prefill. Every type has one (nullptr would mean not written); picks the best variant this CPU
  // runs once (gemm_isa).
  using GemmActFn = void (*)(const void* w, size_t w_stride, int64_t nw, const void* xq, size_t xq_stride,
                             int64_t na, int64_t n, float* out, int64_t ldo);
  GemmActFn gemm_act = nullptr;
  GemmActFn gemm_act_variants[5] = {};  // indexed by GemmIsa (tests call each one the CPU runs)
  // Packed weights for gemm_act (q4_0, q4_1, q8_0; nullptr for the other types): `pack` copies nw rows
  // of n elements (rows w_stride bytes apart) into packed_bytes(nw, n) bytes, 16 rows per group (the
  // last one padded), each block's quants interleaved a dword per row (src/quant/blockint_amx.h), so
  // the 16-row tiles read them with plain loads instead of gathers (AMX: q8_0's weight tile is loaded
  // as it lies). gemm_act_packed(wp, nw, ...) is gemm_act over the nw rows from the group at wp (a
  // tile that starts a whole number of groups into the matrix) with the same bits. Only where
  // gemm_packed_available(); gemm_act_packed_variants has the avx2, avxvnni, avx512vnni and amx
  // slots (tests).
  size_t (*packed_bytes)(int64_t nw, int64_t n) = nullptr;
  void (*pack)(const void* w, size_t w_stride, int64_t nw, int64_t n, void* dst) = nullptr;
  using GemmActPackedFn = void (*)(const void* wp, int64_t nw, const void* xq, size_t xq_stride, int64_t na, int64_t n,
                                   float* out, int64_t ldo);
  GemmActPackedFn gemm_act_packed = nullptr;
  GemmActPackedFn gemm_act_packed_variants[5] = {};
};

// The entry for a quantized type, or nullptr for f32, f16, bf16, i32.
const QuantType* quant_type(DType t);
// The entry for a ggml type id, or nullptr when that id is not a supported quantized type.
const QuantType* quant_type_from_ggml(uint32_t ggml_type);
// All supported quantized types, in ggml id order.
std::span<const QuantType* const> quant_types();
// Instruction sets the dots are built for: generic = the build target (-march=native by default).
enum class DotIsa { generic = 0, avx2 = 1, avx512 = 2 };
// The one QuantType::dot uses on this machine, whether the CPU can run one, and its name.
DotIsa dot_isa();
bool dot_isa_available(DotIsa isa);
std::string_view dot_isa_name(DotIsa isa);

// Instruction sets of gemm_act: generic (dot_act per pair), AVX2 (vpmaddubsw), AVX-VNNI (vpdpbusd on
// 256 bits), AVX-512 VNNI (vpdpbusd on 512 bits) and AMX (AMX-INT8 tiles for q4_0, q4_1, q8_0,
// src/quant/blockint_amx.h; gemm_act takes them from 16 activation rows up (batched decode, prefill), the AVX-512
// VNNI tile below that and for the other types). AMX counts as available when the CPU has AMX-TILE and AMX-INT8 and the
// kernel grants the tile state (Linux arch_prctl ARCH_REQ_XCOMP_PERM, asked once, when the instruction
// sets are first probed; a process-wide grant: signal stacks must then hold the larger AMX signal
// frame, about 11 KiB). All give the same bits.
enum class GemmIsa { generic = 0, avx2 = 1, avxvnni = 2, avx512vnni = 3, amx = 4 };
// The one QuantType::gemm_act uses on this machine (MK_GEMM_ISA=generic|avx2|avxvnni|avx512vnni|amx
// picks a lower one, for benchmarks), whether the CPU can run one, and its name.
GemmIsa gemm_isa();
bool gemm_isa_available(GemmIsa isa);
// Whether gemm_act_packed runs here: gemm_isa() is not generic, and MK_GEMM_PACK=0 (A/B runs: the
// tiles then gather from the GGUF rows) is not set.
bool gemm_packed_available();
std::string_view gemm_isa_name(GemmIsa isa);

// A copy of `m` with weight tensors quantized with quantize_row (for tests and benchmarks: a model
// quantized in memory). `type_of` picks each tensor's type, or nullopt to keep it as it is; only
// f32/f16/bf16 tensors whose rows are a whole number of blocks of the chosen type are converted
// (others are kept). Throws mk::Error when `type_of` names a type that is not quantized.
ModelFile quantize_model(const ModelFile& m, const std::function<std::optional<DType>(const WeightTensor&)>& type_of);
// Every 2-D matrix (token embeddings and output included; norms stay float32) to `t`, or to
// `fallback` where its rows do not fit `t`'s blocks (as llama.cpp falls back for K-quants).
ModelFile quantize_model(const ModelFile& m, DType t, std::optional<DType> fallback = std::nullopt);

}  // namespace mk::quant
