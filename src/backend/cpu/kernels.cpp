#include "backend/cpu/kernels.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <thread>

#include "backend/cpu/dot_lanes.h"
#include "backend/cpu/float_gemm.h"
#include "backend/cpu/vmath.h"
#include "backend/step_batch.h"
#include "ir/ops.h"
#include "support/error.h"

namespace mk::cpu {

namespace {

inline float act(Act a, float v) {
  switch (a) {
    case Act::silu: return silu_f32(v);  // vmath.h: the same bits as glu_mul's spans
    case Act::gelu: return gelu_erf(v);
    case Act::gelu_tanh: return gelu_tanh_approx(v);
    case Act::none: return v;
  }
  return v;
}

// Elements [c0, c1) of row `row` of a weight as float32: a pointer into the model when it is
// float32, else converted into `tmp`.
const float* weight_span(const WeightRef& w, int64_t row, int64_t c0, int64_t c1, float* tmp) {
  if (w.f32) return w.f32 + row * w.row_elems + c0;
  const uint8_t* src = w.data + static_cast<size_t>(row) * w.row_bytes;
  if (w.quant) {  // dequantize the blocks covering [c0, c1), then point inside
    const int64_t bs = w.quant->block_size;
    const int64_t b0 = c0 / bs * bs, b1 = (c1 + bs - 1) / bs * bs;
    w.quant->dequantize_row(src + static_cast<size_t>(b0 / bs * w.quant->block_bytes), tmp, b1 - b0);
    return tmp + (c0 - b0);
  }
  to_f32(w.dtype, src + static_cast<size_t>(c0) * (w.dtype == DType::F32 ? 4 : 2), tmp, c1 - c0);
  return tmp;
}

// x / rms(x) * (w + offset) over n elements (w may be null), with the arithmetic of ggml's
// rms_norm_f32 (ggml-cpu ops.cpp): each square a float product, summed in order in double; the mean
// rounded to float; scale = 1 / sqrtf(mean + eps) in float; (x * scale) * w. An activation row quantized
// to q8_0 after the norm (the q/k/v and gate/up matmuls) rounds some elements the other way when the
// scale differs in its last bit, which on real weights (SmolLM2's few large channels) moved logits by
// up to 0.2 against llama.cpp's on one token (trial 38); random weights hid it.
void rms_norm_span(const float* x, const float* w, double offset, double eps, int64_t n, float* out) {
  double ss = 0;
  for (int64_t j = 0; j < n; ++j) ss += static_cast<double>(x[j] * x[j]);
  const float mean = static_cast<float>(ss / static_cast<double>(n));
  const float inv = 1.0f / std::sqrt(mean + static_cast<float>(eps));
  float off = static_cast<float>(offset);
  if (w)
    for (int64_t j = 0; j < n; ++j) out[j] = x[j] * inv * (w[j] + off);
  else
    for (int64_t j = 0; j < n; ++j) out[j] = x[j] * inv;
}

// Rotates the heads in v[0, n) (n a multiple of head_dim, v at a head boundary) for position pos.
// cos and sin of pos * inv_freq[i] for i < n_rot / 2, interleaved, for activation row r. Kept per
// worker thread and row, and made again when the row's position or the op's frequencies differ:
// every RoPE tile of every layer in a step shares them (they were the step's only sincos calls, 2%
// of a 16-row SmolLM2 step, made again for each tile). Same values as computed in place.
const double* rope_cos_sin(const OpDesc& o, int64_t r, int64_t pos) {
  struct Row {
    int64_t pos = -1;
    std::vector<double> cs;
  };
  thread_local std::vector<double> freq;
  thread_local std::vector<Row> rows;
  if (freq != o.inv_freq) {
    freq = o.inv_freq;
    for (Row& row : rows) row.pos = -1;
  }
  if (static_cast<int64_t>(rows.size()) <= r) rows.resize(static_cast<size_t>(r) + 1);
  Row& row = rows[static_cast<size_t>(r)];
  if (row.pos != pos) {
    const size_t half = freq.size();
    row.cs.resize(2 * half);
    for (size_t i = 0; i < half; ++i) {
      double ang = static_cast<double>(pos) * freq[i];
      row.cs[2 * i] = std::cos(ang);
      row.cs[2 * i + 1] = std::sin(ang);
    }
    row.pos = pos;
  }
  return row.cs.data();
}

// RoPE over columns [c0, c0 + n) of activation row r at position pos, held in v[0, n). Rotated
// halves (NeoX): whole heads (c0 and n multiples of head_dim). Adjacent pairs: any even c0 and n
// (a tile may hold part of a head; column c is dimension c % head_dim of its head).
void rope_span(const OpDesc& o, float* v, int64_t c0, int64_t n, int64_t r, int64_t pos) {
  const int64_t half = o.n_rot / 2;
  const double* cs = rope_cos_sin(o, r, pos);
  auto rotate = [&](float* x0p, float* x1p, int64_t i) {
    const double x0 = *x0p, x1 = *x1p, c = cs[2 * i], s = cs[2 * i + 1];
    *x0p = static_cast<float>(x0 * c - x1 * s);
    *x1p = static_cast<float>(x0 * s + x1 * c);
  };
  if (o.rope_halves) {
    for (int64_t h = 0; h < n; h += o.head_dim)
      for (int64_t i = 0; i < half; ++i) rotate(v + h + i, v + h + i + half, i);
    return;
  }
  for (int64_t j = 0; j < n;) {  // one head's part at a time
    const int64_t d0 = (c0 + j) % o.head_dim, len = std::min(n - j, o.head_dim - d0);
    for (int64_t d = d0; d < std::min(d0 + len, o.n_rot); d += 2) rotate(v + j + d - d0, v + j + d - d0 + 1, d / 2);
    j += len;
  }
}

// ggml's f16 GELU table (ggml-cpu.c ggml_table_gelu_f16: f16(ggml_gelu_f32(x)) for every half x,
// the formula's operations in its order), as floats.
const float* gelu_f16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      const float x = f16_to_f32(static_cast<uint16_t>(i));
      const float g = 0.5f * x * (1.0f + std::tanh(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
      t[i] = f16_to_f32(f32_to_f16(g));
    }
    return t;
  }();
  return table.data();
}
// GELU as llama.cpp's CPU computes it (StepMemory::gelu_f16; ggml_vec_gelu_f32 / ggml_vec_geglu_f32).
inline float gelu_ggml(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return gelu_f16_table()[f32_to_f16(x)];
}

// t[i] = act(a, t[i]) * u[i] for i < n (a GLU's gate and up values); SiLU 16 at a time. gelu_f16:
// GELU (tanh form) through llama.cpp's table.
void glu_mul(Act a, float* t, const float* u, int64_t n, bool gelu_f16) {
  if (a == Act::silu) return silu_mul_span(t, u, n);
  if (a == Act::gelu_tanh && gelu_f16) {
    for (int64_t i = 0; i < n; ++i) t[i] = gelu_ggml(t[i]) * u[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) t[i] = act(a, t[i]) * u[i];
}

struct Ctx {
  const Program& p;
  const StepMemory& m;
  float* scratch;
  float* buf(int b) const {
    const Buffer& B = p.buffers[static_cast<size_t>(b)];
    return reinterpret_cast<float*>((B.kind == BufferKind::kv ? m.kv : m.arena) + B.offset);
  }
  const int32_t* ibuf(int b) const {
    return reinterpret_cast<const int32_t*>(m.arena + p.buffers[static_cast<size_t>(b)].offset);
  }
  // A KV buffer kept as IEEE halves (StepMemory::kv_f16): half(b) says so, hbuf(b) is its first
  // half (buf(b) must not be used for it).
  bool half(int b) const { return m.kv_f16 && p.buffers[static_cast<size_t>(b)].kind == BufferKind::kv; }
  uint16_t* hbuf(int b) const { return reinterpret_cast<uint16_t*>(m.kv + p.buffers[static_cast<size_t>(b)].offset / 2); }
  int64_t cols(int b) const { return p.buffers[static_cast<size_t>(b)].cols; }
  const WeightRef& w(int id) const { return m.weights[static_cast<size_t>(id)]; }
};

// Floats reserved after a matmul tile for R activation rows of K elements quantized to 8-bit blocks
// (at most 37 bytes per 32 elements: q8_K's 292 per 256; two block types for a GLU's gate and up weights).
inline int64_t act_q8_floats(int64_t R, int64_t K) { return (2 * R * ((K + 31) / 32) * 37 + 3) / 4 + 16; }

// Where a matmul tile keeps its parts in the worker's scratch (float offsets), for R activation rows
// of K elements and T output columns: the one layout matmul() uses and scratch_floats() sizes.
struct MatmulScratch {
  int64_t rows;   // [R, K] RMS-normalised activation rows (pro_rms only; the norm weight converted at `wtmp`)
  int64_t wtmp;   // 4 converted weight rows, `stride` floats apart
  int64_t utmp;   // 4 converted up rows (GLU)
  int64_t tile;   // [R, T] results
  int64_t act;    // activation rows quantized to 8-bit blocks (act_q8 without an act cache)
  int64_t utile;  // [R, T] the GLU's up results
  int64_t end;    // floats in all
  static int64_t stride(int64_t K) { return K + 32; }
};
MatmulScratch matmul_scratch(int64_t R, int64_t K, int64_t T, bool pro_rms) {
  MatmulScratch m{};
  m.rows = 0;
  m.wtmp = pro_rms ? R * K : 0;
  m.utmp = m.wtmp + 4 * MatmulScratch::stride(K);
  m.tile = m.utmp + 4 * MatmulScratch::stride(K);
  m.act = m.tile + R * T;
  m.utile = m.act + act_q8_floats(R, K);
  m.end = m.utile + R * T;
  return m;
}

// Prepares rows [0, R) into a shared slot (ActShared) with the other workers that run tiles of the
// same key now: claims chunks of kActChunkRows rows until none is left, prepares each (prep(r) per
// row), then waits until every chunk is done (acquire: the rows others wrote are visible).
constexpr int64_t kActChunkRows = 4;
template <class Prep>
void act_rows_shared(ActShared& sh, uint64_t tag, int64_t R, Prep prep) {
  const uint64_t n = static_cast<uint64_t>((R + kActChunkRows - 1) / kActChunkRows);
  uint64_t cl = sh.claim.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t k = (cl >> 16) != tag ? 0 : (cl & 0xffff);
    if (k >= n) break;
    if (!sh.claim.compare_exchange_weak(cl, (tag << 16) | (k + 1), std::memory_order_relaxed)) continue;
    for (int64_t r = static_cast<int64_t>(k) * kActChunkRows; r < std::min<int64_t>(R, static_cast<int64_t>(k + 1) * kActChunkRows); ++r)
      prep(r);
    uint64_t d = sh.done.load(std::memory_order_relaxed);
    while (!sh.done.compare_exchange_weak(d, ((d >> 16) != tag ? tag << 16 : d) + 1, std::memory_order_release,
                                          std::memory_order_relaxed)) {
    }
    cl = sh.claim.load(std::memory_order_relaxed);
  }
  const uint64_t all = (tag << 16) | n;
  for (int spins = 0; sh.done.load(std::memory_order_acquire) != all; ++spins) {
    if (spins < 4096) cpu_relax();  // another worker is preparing its last chunk
    else std::this_thread::yield();
  }
}

void matmul(const Ctx& c, const OpDesc& o, const Instr& in, int64_t R) {
  const int64_t K = o.k, T = in.c1 - in.c0;
  float* s = c.scratch;
  const float* x = c.buf(o.x);
  const int64_t xs = c.cols(o.x);
  const WeightRef& W = c.w(o.w);
  const bool act_q8 = W.act_q8 && (o.glu == Act::none || c.w(o.w_up).act_q8);
  // The activation rows this worker prepared for an earlier tile of this op in this step: quantized
  // (act_q8) or, on the float path, RMS-normalised (pro_rms).
  uint32_t* cache_tag = c.m.act_cache ? reinterpret_cast<uint32_t*>(c.m.act_cache) : nullptr;
  const bool cache_rows = cache_tag && (act_q8 || o.pro_rms);
  const uint32_t key = static_cast<uint32_t>(c.m.act_key ? c.m.act_key[in.op] : in.op);
  const bool cached = cache_rows && cache_tag[0] == c.m.step && cache_tag[1] == key;
  // the rows come from a slot that every worker running this key's tiles prepares together
  const int32_t act_slot = act_q8 && c.m.act_slot && c.m.act_shared ? c.m.act_slot[in.op] : -1;
  const MatmulScratch ms = matmul_scratch(R, K, T, o.pro_rms);
  const int64_t stride = MatmulScratch::stride(K);
  float* wtmp = s + ms.wtmp;
  float* utmp = s + ms.utmp;
  float* tile = s + ms.tile;
  float* utile = s + ms.utile;
  if (o.pro_rms && !act_q8 && cache_rows) {  // float rows normalised once per (worker, step, op)
    float* rows = c.m.act_cache + 16;
    if (!cached) {
      const float* wn = weight_span(c.w(o.norm_w), 0, 0, K, wtmp);
      for (int64_t r = 0; r < R; ++r) rms_norm_span(x + r * xs, wn, o.weight_offset, o.eps, K, rows + r * K);
      cache_tag[0] = c.m.step;
      cache_tag[1] = key;
    }
    x = rows;
  } else if (o.pro_rms && !cached && act_slot < 0) {  // normalise the rows once per tile
    const float* wn = weight_span(c.w(o.norm_w), 0, 0, K, wtmp);
    for (int64_t r = 0; r < R; ++r) rms_norm_span(x + r * xs, wn, o.weight_offset, o.eps, K, s + ms.rows + r * K);
    x = s + ms.rows;
  }
  const int64_t ldx = o.pro_rms && act_slot < 0 ? K : xs;
  if (act_q8) {
    // llama.cpp's arithmetic: each activation row quantized to 8-bit blocks, then integer block dots
    // (src/quant/quant.h dot_act); the same for decode and prefill rows. The quantized rows are kept
    // in the worker's act_cache for its next tile of this op (or, without a cache, made per tile).
    const WeightRef& U = c.w(o.w_up);
    const quant::ActQuant* aw = W.quant->act;
    const quant::ActQuant* au = o.glu != Act::none ? U.quant->act : aw;
    const size_t wrow = static_cast<size_t>(K / aw->block_size * aw->block_bytes);
    const size_t urow = static_cast<size_t>(K / au->block_size * au->block_bytes);
    uint8_t* xw = act_slot >= 0  ? c.m.act_shared[act_slot].rows
                  : cache_tag ? reinterpret_cast<uint8_t*>(c.m.act_cache + 16)
                              : reinterpret_cast<uint8_t*>(s + ms.act);
    uint8_t* xu = au == aw ? xw : xw + R * wrow;
    if (!cached && act_slot >= 0) {
      const float* wn = o.pro_rms ? weight_span(c.w(o.norm_w), 0, 0, K, wtmp) : nullptr;
      const uint64_t tag = ((uint64_t{c.m.step} << 20) | key) & ((uint64_t{1} << 48) - 1);
      act_rows_shared(c.m.act_shared[act_slot], tag, R, [&](int64_t r) {
        const float* xr = x + r * xs;
        if (o.pro_rms) {
          rms_norm_span(xr, wn, o.weight_offset, o.eps, K, s + ms.rows);
          xr = s + ms.rows;
        }
        aw->quantize_row(xr, xw + r * wrow, K);
        if (au != aw) au->quantize_row(xr, xu + r * urow, K);
      });
      if (cache_tag) {  // this worker has seen the slot complete for this step and key
        cache_tag[0] = c.m.step;
        cache_tag[1] = key;
      }
    } else if (!cached) {
      for (int64_t r = 0; r < R; ++r) aw->quantize_row(x + r * ldx, xw + r * wrow, K);
      if (au != aw)
        for (int64_t r = 0; r < R; ++r) au->quantize_row(x + r * ldx, xu + r * urow, K);
      if (cache_tag) {
        cache_tag[0] = c.m.step;
        cache_tag[1] = key;
      }
    }
    // A plain matmul (no GLU, no epilogue, a float output: the logits) writes its rows where they
    // go instead of through the tile (16 rows of 49152 logits are 3 MB a step).
    const bool direct = o.glu == Act::none && o.epi == Epi::none && !c.half(o.out);
    float* dst = direct ? c.buf(o.out) + in.c0 : tile;
    const int64_t ldd = direct ? c.cols(o.out) : T;
    if (W.packed && (o.glu == Act::none || U.packed) && in.c0 % 16 == 0) {
      // Packed weights (QuantType::pack): the 16-row tiles with plain loads; the same bits.
      const size_t g0 = static_cast<size_t>(in.c0 / 16);
      W.quant->gemm_act_packed(W.packed + g0 * W.packed_group_bytes, T, xw, wrow, R, K, dst, ldd);
      if (direct) return;
      if (o.glu != Act::none) {
        U.quant->gemm_act_packed(U.packed + g0 * U.packed_group_bytes, T, xu, urow, R, K, utile, T);
        glu_mul(o.glu, tile, utile, R * T, c.m.gelu_f16);
      }
    } else {
      // Register-blocked tiles (several weight rows x several activation rows per pass, VNNI where
      // the CPU has it; every quantized type has one): the same bits as dot_act per element.
      W.quant->gemm_act(W.data + static_cast<size_t>(in.c0) * W.row_bytes, W.row_bytes, T, xw, wrow, R, K, dst, ldd);
      if (direct) return;
      if (o.glu != Act::none) {
        U.quant->gemm_act(U.data + static_cast<size_t>(in.c0) * U.row_bytes, U.row_bytes, T, xu, urow, R, K, utile, T);
        glu_mul(o.glu, tile, utile, R * T, c.m.gelu_f16);
      }
    }
  } else if (R == 1 && W.quant) {
    // Decode over quantized weights: each row's blocks are dequantized inside the dot (the same bits
    // as dequantize-then-dot, src/quant/quant.h), never expanded to a float row.
    const WeightRef& U = c.w(o.w_up);
    for (int64_t j = in.c0; j < in.c1; ++j) {
      float v = W.quant->dot(W.data + static_cast<size_t>(j) * W.row_bytes, x, K);
      if (o.glu != Act::none) {
        const float u = U.quant ? U.quant->dot(U.data + static_cast<size_t>(j) * U.row_bytes, x, K)
                                : dot(x, weight_span(U, j, 0, K, utmp), K);
        v = act(o.glu, v) * u;
      }
      tile[j - in.c0] = v;
    }
  } else if (R < 4) {
    // Decode: stream the weight tile row after row (one sequential stream reads ~25% faster than
    // four interleaved ones here); the GLU's up rows are a second pass over their own tile.
    for (int64_t j = in.c0; j < in.c1; ++j) {
      const float* wr = weight_span(W, j, 0, K, wtmp);
      for (int64_t r = 0; r < R; ++r) tile[r * T + (j - in.c0)] = dot(x + r * ldx, wr, K);
    }
    if (o.glu != Act::none)
      for (int64_t j = in.c0; j < in.c1; ++j) {
        const float* ur = weight_span(c.w(o.w_up), j, 0, K, utmp);
        for (int64_t r = 0; r < R; ++r) {
          float& v = tile[r * T + (j - in.c0)];
          v = act(o.glu, v) * dot(x + r * ldx, ur, K);
        }
      }
  } else {
    // Many rows (prefill, batched decode): register-blocked tiles of several activation rows x
    // several weight rows (float_gemm.h), each element with dot()'s bits, so a row computed in a
    // batch equals the row computed alone. Float32 weights: up to 64 rows per call, pointers into
    // the model (gemm_f32 prefetches the next rows); others four converted rows at a time (f16,
    // bf16, the quantized types without act_q8).
    const bool glu = o.glu != Act::none;
    const WeightRef* U = glu ? &c.w(o.w_up) : nullptr;
    const bool direct = W.f32 && (!glu || U->f32);
    const int64_t step = direct ? 64 : 4;
    for (int64_t j = in.c0; j < in.c1; j += step) {
      const int64_t n = std::min<int64_t>(step, in.c1 - j);
      const float* wr[64];
      for (int64_t q = 0; q < n; ++q)
        wr[q] = direct ? W.f32 + (j + q) * W.row_elems : weight_span(W, j + q, 0, K, wtmp + q * stride);
      gemm_f32(x, ldx, R, wr, n, K, tile + (j - in.c0), T);
      if (glu) {
        for (int64_t q = 0; q < n; ++q)
          wr[q] = direct ? U->f32 + (j + q) * U->row_elems : weight_span(*U, j + q, 0, K, utmp + q * stride);
        gemm_f32(x, ldx, R, wr, n, K, utile + (j - in.c0), T);
      }
    }
    if (glu)
      for (int64_t r = 0; r < R; ++r)
        glu_mul(o.glu, tile + r * T, utile + r * T, T, c.m.gelu_f16);
  }
  const int64_t oc = c.cols(o.out);
  const int32_t* slot = o.epi == Epi::store || o.epi == Epi::rope_store ? c.ibuf(c.p.kv_slot_buffer) : nullptr;
  if (o.epi == Epi::rope || o.epi == Epi::rope_store) {
    const int32_t* pos = c.ibuf(o.pos);
    for (int64_t r = 0; r < R; ++r) rope_span(o, tile + r * T, in.c0, T, r, pos[r]);
  }
  if (c.half(o.out)) {  // rows of the f16 KV cache
    uint16_t* out = c.hbuf(o.out);
    for (int64_t r = 0; r < R; ++r) f32_to_f16_span(tile + r * T, out + (slot ? slot[r] : r) * oc + in.c0, T);
    return;
  }
  float* out = c.buf(o.out);
  if (o.epi == Epi::add) {
    const float* res = c.buf(o.res);
    const int64_t rs = c.cols(o.res);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < T; ++j) out[r * oc + in.c0 + j] = tile[r * T + j] + res[r * rs + in.c0 + j];
    return;
  }
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(out + (slot ? slot[r] : r) * oc + in.c0, tile + r * T, static_cast<size_t>(T) * 4);
}

// Slot j's expert of route row `rt` (moe_route writes whole numbers in [0, n_expert)).
inline int64_t moe_expert(const float* rt, int64_t j, int64_t n_expert) {
  const float v = rt[j];
  return v >= 0 && v < static_cast<float>(n_expert) ? static_cast<int64_t>(v) : 0;
}

// Floats of scratch moe_matmul uses: a converted weight row, an activation row quantized to 8-bit
// blocks, the tile's accumulators.
int64_t moe_scratch_floats(int64_t K, int64_t T) { return MatmulScratch::stride(K) + act_q8_floats(1, K) + 3 * T + 64; }

// moe_matmul (isa/instr.def): per row and slot, the expert's weight rows against the row's x (the
// slot's part of it when reducing) with matmul's per-element arithmetic: act_q8 weights dot 8-bit
// activation rows (llama.cpp's mul_mat_id quantizes them as mul_mat does), other quantized types
// dequantize inside the dot, float types convert a row at a time. Reduce: p_j * v added in slot
// order (llama.cpp: ggml_mul by the weights, then the slots' views added one after another).
void moe_matmul(const Ctx& c, const OpDesc& o, const Instr& in, int64_t R) {
  const int64_t k = o.n_expert_used, n = o.w_rows, K = o.moe_reduce ? o.k / k : o.k, T = in.c1 - in.c0;
  const WeightRef& W = c.w(o.w);
  const float* x = c.buf(o.x);
  const float* route = c.buf(o.y);
  const int64_t xs = c.cols(o.x), rs = c.cols(o.y);
  float* out = c.buf(o.out);
  const int64_t oc = c.cols(o.out);
  float* wtmp = c.scratch;
  uint8_t* xq = reinterpret_cast<uint8_t*>(c.scratch + MatmulScratch::stride(K));
  float* acc = c.scratch + MatmulScratch::stride(K) + act_q8_floats(1, K);
  float* vals = acc + T;
  float* uvals = vals + T;  // a GLU's up results
  const WeightRef* U = o.w_up >= 0 ? &c.w(o.w_up) : nullptr;
  const int64_t j_fixed = o.moe_reduce ? -1 : in.c0 / n, lc0 = o.moe_reduce ? in.c0 : in.c0 - j_fixed * n;
  for (int64_t r = 0; r < R; ++r) {
    const float* rt = route + r * rs;
    if (o.moe_reduce) std::fill(acc, acc + T, 0.0f);
    for (int64_t j = o.moe_reduce ? 0 : j_fixed; j < (o.moe_reduce ? k : j_fixed + 1); ++j) {
      const int64_t e = moe_expert(rt, j, o.n_expert);
      const float* xr = x + r * xs + (o.moe_reduce ? j * K : 0);
      const int64_t row0 = e * n + lc0;
      // The expert's T rows of one weight into `v` (the fuse pass keeps a GLU's two weights of one
      // dtype, so both take the same path and the activation row is quantized once).
      auto rows = [&](const WeightRef& M, float* v) {
        if (M.act_q8) {  // the register-blocked tile over the rows: dot_act's bits per element
          if (M.packed && row0 % 16 == 0)  // packed weights (QuantType::pack): the same bits
            M.quant->gemm_act_packed(M.packed + static_cast<size_t>(row0 / 16) * M.packed_group_bytes, T, xq, 0, 1, K, v, T);
          else
            M.quant->gemm_act(M.data + static_cast<size_t>(row0) * M.row_bytes, M.row_bytes, T, xq, 0, 1, K, v, T);
        } else {
          for (int64_t t = 0; t < T; ++t)
            v[t] = M.quant ? M.quant->dot(M.data + static_cast<size_t>(row0 + t) * M.row_bytes, xr, K)
                           : dot(xr, weight_span(M, row0 + t, 0, K, wtmp), K);
        }
      };
      if (W.act_q8) W.quant->act->quantize_row(xr, xq, K);
      rows(W, vals);
      if (U) {
        rows(*U, uvals);
        glu_mul(o.glu, vals, uvals, T, c.m.gelu_f16);
      }
      for (int64_t t = 0; t < T; ++t) {
        if (o.moe_reduce) acc[t] += vals[t] * rt[k + j];
        else out[r * oc + in.c0 + t] = vals[t];
      }
    }
    if (o.moe_reduce) std::memcpy(out + r * oc + in.c0, acc, static_cast<size_t>(T) * 4);
  }
}

// Positions row r attends to: [begin, end) of its sequence (causal: [0, positions[r]]; with a
// sliding window the last o.window of them). The one place attention and attention_partial take a
// row's range from.
struct KvRange {
  int64_t begin, end;
};

// One attention score from its dot product q.k: scaled, then soft-capped when cap > 0 (Gemma 2).
inline float attn_score(float dot, float scale, float cap) {
  const float s = dot * scale;
  return cap > 0 ? softcap(s, cap) : s;
}
KvRange attn_kv_range(const Ctx& c, const OpDesc& o, int64_t r) {
  const int64_t end = int64_t{c.ibuf(c.p.positions_buffer)[r]} + 1;
  return {o.window > 0 ? std::max<int64_t>(0, end - o.window) : 0, end};
}

// Asks for the n floats at p in L1 ahead of use (prefetcht0 per 64-byte line; never faults). The
// cached K/V rows of one head are hd floats at a stride of the whole KV row (and scattered by the
// block table), which the hardware prefetcher does not follow: without it a long-context decode
// spent most of attention waiting on these loads (docs/PERFORMANCE.md, 2026-12-02).
inline void prefetch_floats(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 3);
}
inline void prefetch_halves(const uint16_t* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 32) __builtin_prefetch(p + i, 0, 3);
}
constexpr int64_t kKvPrefetchAhead = 8;  // positions

// Pool rows of positions [lo, hi) of row r's sequence, through its block table: kv_row[j - lo].
void attn_kv_rows(const Ctx& c, int64_t r, int64_t lo, int64_t hi, int32_t* kv_row) {
  const int64_t B = c.p.kv_block_size;
  const int32_t* bt = c.ibuf(c.p.block_table_buffer) + c.ibuf(c.p.row_seq_buffer)[r] * c.p.max_blocks_per_seq();
  for (int64_t j = lo; j < hi;) {  // a block at a time (no division per position)
    const int64_t b = j / B, e = std::min(hi, (b + 1) * B);
    const int64_t base = int64_t{bt[b]} * B - b * B;
    for (; j < e; ++j) kv_row[j - lo] = static_cast<int32_t>(base + j);
  }
}

// attention's passes: f(r, n_kv, g, ha, nh) for each row r of the tile (its part of the R rows,
// instr_rows; kv_row then holds the row's n_kv pool rows) and each run of the tile's heads
// [ha, ha + nh) in one KV group g, at most np heads.
template <class F>
void attn_passes(const Ctx& c, const OpDesc& o, const Instr& in, int64_t R, int64_t np, int32_t* kv_row, F f) {
  const int64_t hd = o.head_dim, hpg = o.n_head / o.n_head_kv, h1 = in.c1 / hd;
  int64_t r0 = 0, r1 = R;
  instr_rows(R, in.row_part, in.row_parts, &r0, &r1);
  for (int64_t r = r0; r < r1; ++r) {
    const KvRange range = attn_kv_range(c, o, r);
    attn_kv_rows(c, r, range.begin, range.end, kv_row);
    for (int64_t ha = in.c0 / hd; ha < h1;) {
      const int64_t g = ha / hpg, hb = std::min({h1, (g + 1) * hpg, ha + np});
      f(r, range.end - range.begin, g, ha, hb - ha);
      ha = hb;
    }
  }
}

// attention's V pass over one chunk of n cached positions: acc[h][i] += p[h * sst + j] * v[j][i] for
// heads h < HN and i < 16 * HV, positions j in order (a multiply, then an add: the scalar loop's
// bits), the accumulators held in registers for the chunk.
inline VF16 ld_v16f(const float* p) {  // VF16: vmath.h's 16-float vector
  VF16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <int HV, int HN>
void attn_pv_chunk(const float* const* v, int64_t n, const float* p, int64_t sst, float* acc, int64_t acc_stride) {
  VF16 a[HN][HV];
  for (int h = 0; h < HN; ++h)
    for (int k = 0; k < HV; ++k) a[h][k] = ld_v16f(acc + h * acc_stride + 16 * k);
  for (int64_t j = 0; j < n; ++j) {
    VF16 x[HV];
    for (int k = 0; k < HV; ++k) x[k] = ld_v16f(v[j] + 16 * k);
    for (int h = 0; h < HN; ++h) {
      const float pj = p[h * sst + j];
      for (int k = 0; k < HV; ++k) a[h][k] += pj * x[k];
    }
  }
  for (int h = 0; h < HN; ++h)
    for (int k = 0; k < HV; ++k) std::memcpy(acc + h * acc_stride + 16 * k, &a[h][k], sizeof(VF16));
}
// The same for nh heads (accumulators acc_stride floats apart) and head_dim hd: register passes of
// up to 16 vectors for hd 64 and 128, else the scalar loop.
void attn_pv(const float* const* v, int64_t n, const float* p, int64_t sst, int64_t nh, int64_t hd, float* acc,
             int64_t acc_stride) {
  for (int64_t h = 0; h < nh;) {
    const int64_t left = nh - h;
    float* ah = acc + h * acc_stride;
    const float* ph = p + h * sst;
    if (hd == 64) {
      switch (std::min<int64_t>(left, 4)) {
        case 1: attn_pv_chunk<4, 1>(v, n, ph, sst, ah, acc_stride); break;
        case 2: attn_pv_chunk<4, 2>(v, n, ph, sst, ah, acc_stride); break;
        case 3: attn_pv_chunk<4, 3>(v, n, ph, sst, ah, acc_stride); break;
        default: attn_pv_chunk<4, 4>(v, n, ph, sst, ah, acc_stride); break;
      }
      h += std::min<int64_t>(left, 4);
    } else if (hd == 128) {
      if (left >= 2) attn_pv_chunk<8, 2>(v, n, ph, sst, ah, acc_stride);
      else attn_pv_chunk<8, 1>(v, n, ph, sst, ah, acc_stride);
      h += std::min<int64_t>(left, 2);
    } else {
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < hd; ++i) ah[i] += ph[j] * v[j][i];
      h += 1;
    }
  }
}

// Scratch of `attention` (scratch_floats): the score rows of up to kAttnPassHeads heads of one KV
// group, the pool rows and the K row pointers of the positions, the heads' accumulators, f16 queries
// and sums, and (f16 KV cache) a chunk of K rows and a V row converted to float. Heads of a group beyond kAttnPassHeads (MQA-like models) take further passes, which
// bounds the scratch at ~(kAttnPassHeads + 3) * n_ctx floats per worker.
constexpr int64_t kAttnPassHeads = 8;
constexpr int64_t kAttnScoreChunk = 32;  // positions per gemm_f32 call: the next chunk's K rows are prefetched
static_assert(sizeof(const float*) <= 2 * sizeof(float));
int64_t attn_score_stride(const Program& p) { return (p.n_ctx + 16 + 15) / 16 * 16; }
int64_t attn_pass_heads(const OpDesc& o) { return std::min(kAttnPassHeads, o.n_head / o.n_head_kv); }
int64_t attn_scratch_floats(const Program& p, const OpDesc& o) {
  const int64_t nh = attn_pass_heads(o), sst = attn_score_stride(p);
  // the last part: converted K/V rows, or attention_f16's 16 lane vectors of each head
  return nh * sst + sst + 2 * sst + 2 * nh * (o.head_dim + 16) + nh + 64 +
         std::max((kAttnScoreChunk + 1) * (o.head_dim + 16), nh * 256);
}

#if defined(__AVX512F__)
std::atomic<bool> g_attention_avx512{true};
#else
std::atomic<bool> g_attention_avx512{false};
#endif

// Sum of x[0, n) in double as the f16 cache's softmax takes it: 16 lanes (element j to lane j mod
// 16, in order), then lanes l + 8, + 4, + 2, + 1 (attn_sum_tree), the same in every path.
double attn_sum_tree(double* l) {
  for (int s = 8; s > 0; s /= 2)
    for (int i = 0; i < s; ++i) l[i] += l[i + s];
  return l[0];
}
double attn_sum_f64(const float* x, int64_t n) {
  double l[16] = {};
  for (int64_t j = 0; j < n; ++j) l[j % 16] += x[j];
  return attn_sum_tree(l);
}

#if defined(__AVX512F__)
// GCC 12's AVX-512 shuffle intrinsics start from _mm512_undefined_ps, which -Wuninitialized
// reports at every inlined use (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The f16 KV cache on AVX-512, for head_dim a multiple of 16: the same operations in the same order
// as `attention` below with an f16 cache (so the same bits; tests/unit/test_cpu.cpp compares them),
// with the K and V rows converted in registers where they are used instead of into a buffer first.
//
// Scores, 16 positions at a time: each position's 16 lanes of dot_f32 (dot_lanes.h: lane l sums
// q[i] * k[i] for i = l mod 16 in index order, from 0) into a lane vector, then dot_f32's tree
// (lanes l + 8, then + 4, + 2, + 1) for the 16 vectors at once by the usual transposing adds: each
// add is one of the tree's (a + b is b + a), so every score has dot_f32's bits. Position p's lane
// vector goes to slot 4 (p % 4) + p / 4, which puts score p in lane p at the end.
inline int attn_tree_slot(int p) { return 4 * (p % 4) + p / 4; }
__m512 attn_tree16(const float* lanes) {  // lanes: 16 slots of 16 floats
  __m512 w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = _mm512_load_ps(lanes + 32 * i), b = _mm512_load_ps(lanes + 32 * i + 16);
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));  // l + 8
  }
  for (int i = 0; i < 4; ++i)
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));  // l + 4
  for (int i = 0; i < 2; ++i) {
    const __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
    y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));  // l + 2
  }
  return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));  // l + 1
}
inline __m512 ld_f16x16(const uint16_t* h) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
}
constexpr int64_t kAttnPf = 16;  // positions the K and V rows are prefetched ahead
inline void prefetch_row_f16(const uint16_t* p, int64_t hd) {
  for (int64_t i = 0; i < hd; i += 32) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

// Scores of nh heads (queries q, hd floats apart, already f16 values) against the K rows of
// positions [0, n) (kr: the row of each position, halves): score[h * sst + j], dot_f32's bits.
template <int HD>
void attn_scores_f16(const float* q, int64_t nh, const uint16_t* const* kr, int64_t n, float* score, int64_t sst,
                     float* lanes) {
  constexpr int P = HD / 16;
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int m = static_cast<int>(std::min<int64_t>(16, n - j0));
    for (int64_t j = j0 + kAttnPf; j < std::min(n, j0 + kAttnPf + 16); ++j) prefetch_row_f16(kr[j], HD);
    for (int p = 0; p < 16; ++p) {
      const int slot = attn_tree_slot(p);
      if (p >= m) {
        for (int64_t h = 0; h < nh; ++h) _mm512_store_ps(lanes + (h * 16 + slot) * 16, _mm512_setzero_ps());
        continue;
      }
      __m512 k[P];
      for (int i = 0; i < P; ++i) k[i] = ld_f16x16(kr[j0 + p] + 16 * i);
      for (int64_t h = 0; h < nh; ++h) {
        __m512 a = _mm512_setzero_ps();
        for (int i = 0; i < P; ++i) a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_loadu_ps(q + h * HD + 16 * i), k[i]));
        _mm512_store_ps(lanes + (h * 16 + slot) * 16, a);
      }
    }
    for (int64_t h = 0; h < nh; ++h) {
      const __m512 s = attn_tree16(lanes + h * 256);
      _mm512_mask_storeu_ps(score + h * sst + j0, static_cast<__mmask16>((1u << m) - 1), s);
    }
  }
}

// The V pass of up to 4 heads (HN) over positions [0, n): acc[h][i] += p[h * sst + j] * v_j[i], a
// multiply then an add per position in order (attn_pv_chunk's operations), V rows converted in
// registers, the accumulators in registers throughout.
template <int HD, int HN>
void attn_pv_f16(const uint16_t* const* vr, int64_t n, const float* p, int64_t sst, float* acc, int64_t acc_stride) {
  constexpr int P = HD / 16;
  __m512 a[HN][P];
  for (int h = 0; h < HN; ++h)
    for (int i = 0; i < P; ++i) a[h][i] = _mm512_loadu_ps(acc + h * acc_stride + 16 * i);
  for (int64_t j = 0; j < n; ++j) {
    if (j % 16 == 0)
      for (int64_t t = j + kAttnPf; t < std::min(n, j + kAttnPf + 16); ++t) prefetch_row_f16(vr[t], HD);
    __m512 x[P];
    for (int i = 0; i < P; ++i) x[i] = ld_f16x16(vr[j] + 16 * i);
    for (int h = 0; h < HN; ++h) {
      const __m512 pj = _mm512_set1_ps(p[h * sst + j]);
      for (int i = 0; i < P; ++i) a[h][i] = _mm512_add_ps(a[h][i], _mm512_mul_ps(pj, x[i]));
    }
  }
  for (int h = 0; h < HN; ++h)
    for (int i = 0; i < P; ++i) _mm512_storeu_ps(acc + h * acc_stride + 16 * i, a[h][i]);
}
template <int HD>
void attn_pv_f16_heads(const uint16_t* const* vr, int64_t n, const float* p, int64_t sst, int64_t nh, float* acc,
                       int64_t acc_stride) {
  constexpr int kMax = HD <= 64 ? 4 : 2;  // heads per pass: 16 (HD 64) or 16 (HD 128) accumulators
  for (int64_t h = 0; h < nh;) {
    const int64_t k = std::min<int64_t>(nh - h, kMax);
    float* ah = acc + h * acc_stride;
    const float* ph = p + h * sst;
    switch (k) {
      case 1: attn_pv_f16<HD, 1>(vr, n, ph, sst, ah, acc_stride); break;
      case 2: attn_pv_f16<HD, 2>(vr, n, ph, sst, ah, acc_stride); break;
      case 3: if constexpr (kMax >= 3) attn_pv_f16<HD, 3>(vr, n, ph, sst, ah, acc_stride); break;
      default: if constexpr (kMax >= 4) attn_pv_f16<HD, 4>(vr, n, ph, sst, ah, acc_stride); break;
    }
    h += k;
  }
}

// Softmax of one head's n scores with an f16 cache, in place (attention's operations: scale, max,
// exp(s - max), sum in double, p = round_f16(e / sum)). The double sum is attn_sum_f64's: 16 lanes,
// then attn_sum_tree.
void attn_softmax_f16(float* sc, int64_t n, float scale, float cap) {
  const __m512 vs = _mm512_set1_ps(scale);
  __m512 vm = _mm512_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 16 <= n && cap == 0; j += 16) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(sc + j), vs);
    _mm512_storeu_ps(sc + j, v);
    vm = _mm512_max_ps(vm, v);
  }
  float mx = _mm512_reduce_max_ps(vm);
  for (; j < n; ++j) {
    sc[j] = attn_score(sc[j], scale, cap);
    mx = std::max(mx, sc[j]);
  }
  exp_sub_span(sc, sc, n, mx);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();  // lanes 0-7 and 8-15 of attn_sum_f64
  for (j = 0; j < n; j += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(static_cast<__mmask16>(n - j >= 16 ? 0xffff : (1u << (n - j)) - 1), sc + j);
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
  }
  alignas(64) double l[16];
  _mm512_store_pd(l, lo);
  _mm512_store_pd(l + 8, hi);
  const float inv = static_cast<float>(1.0 / attn_sum_tree(l));
  const __m512 vi = _mm512_set1_ps(inv);
  for (j = 0; j + 16 <= n; j += 16)
    _mm512_storeu_ps(sc + j, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(sc + j), vi),
                                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  for (; j < n; ++j) sc[j] = round_f16(sc[j] * inv);
}

// `attention` for an f16 cache and head_dim 64 or 128 (see above); false: not this case (nothing done).
template <int HD>
void attention_f16_hd(const Ctx& c, const OpDesc& o, const Instr& in, int64_t R) {
  const float* q = c.buf(o.x);
  const uint16_t* kh = c.hbuf(o.y);
  const uint16_t* vh = c.hbuf(o.z);
  float* out = c.buf(o.out);
  const int64_t qs = c.cols(o.x), ks = c.cols(o.y), vs = c.cols(o.z), os = c.cols(o.out);
  const float scale = static_cast<float>(o.scale), cap = static_cast<float>(o.softcap);
  const int64_t sst = attn_score_stride(c.p), np = attn_pass_heads(o);
  // `attention`'s scratch layout; the K/V row pointers are halves here, the last part the lanes
  float* score = c.scratch;                                              // [np][sst]
  int32_t* kv_row = reinterpret_cast<int32_t*>(score + np * sst);        // [sst]
  const uint16_t** kr = reinterpret_cast<const uint16_t**>(kv_row + sst);  // [sst]
  float* acc = reinterpret_cast<float*>(kr + sst);                       // [np][HD + 16]
  float* q16 = acc + np * (HD + 16);                                     // [np][HD]
  float* lanes = q16 + np * (HD + 16) + np + 64 - (np + 64) % 16;        // [np][16][16], 64-byte aligned
  const int64_t cst = HD + 16;
  attn_passes(c, o, in, R, np, kv_row, [&](int64_t r, int64_t n_kv, int64_t g, int64_t ha, int64_t nh) {
    const float* qg = q + r * qs + ha * HD;
    for (int64_t i = 0; i < nh * HD; i += 16)  // the queries rounded to f16 (round_f16's bits)
      _mm512_storeu_ps(q16 + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(qg + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    for (int64_t j = 0; j < n_kv; ++j) kr[j] = kh + int64_t{kv_row[j]} * ks + g * HD;
    for (int64_t j = 0; j < std::min<int64_t>(kAttnPf, n_kv); ++j) prefetch_row_f16(kr[j], HD);
    attn_scores_f16<HD>(q16, nh, kr, n_kv, score, sst, lanes);
    for (int64_t j = 0; j < n_kv; ++j) kr[j] = vh + int64_t{kv_row[j]} * vs + g * HD;
    for (int64_t j = 0; j < std::min<int64_t>(kAttnPf, n_kv); ++j) prefetch_row_f16(kr[j], HD);
    for (int64_t hh = 0; hh < nh; ++hh) attn_softmax_f16(score + hh * sst, n_kv, scale, cap);
    std::fill(acc, acc + nh * cst, 0.0f);
    attn_pv_f16_heads<HD>(kr, n_kv, score, sst, nh, acc, cst);
    for (int64_t hh = 0; hh < nh; ++hh) {  // sum = 1 (the probabilities are normalised)
      float* oh = out + r * os + (ha + hh) * HD;
      const float* ah = acc + hh * cst;
      std::memcpy(oh, ah, HD * sizeof(float));  // ah / 1: the same values
    }
  });
}
bool attention_f16(const Ctx& c, const OpDesc& o, const Instr& in, int64_t R) {
  if (!c.half(o.y) || !c.m.kv_f16) return false;
  if (o.head_dim == 64) return attention_f16_hd<64>(c, o, in, R), true;
  if (o.head_dim == 128) return attention_f16_hd<128>(c, o, in, R), true;
  return false;
}
#pragma GCC diagnostic pop
#endif

// Per row, the heads of the tile a KV group at a time (up to kAttnPassHeads per pass): the heads'
// scores as gemm_f32 of their queries against the cached K rows, 32 positions per call with the next
// 32 rows prefetched (each score dot_f32's bits, as the per-head dot() before it), the softmax per
// head, then V: each cached V row loaded once for all the pass's heads, every head's accumulator
// getting the same operations in the same order as alone.
void attention(const Ctx& c, const OpDesc& o, const Instr& in, int64_t R) {
#if defined(__AVX512F__)
  if (g_attention_avx512.load(std::memory_order_relaxed) && attention_f16(c, o, in, R)) return;
#endif
  const int64_t hd = o.head_dim;
  const bool half = c.half(o.y);  // K and V rows as IEEE halves (kv_f16)
  const float* q = c.buf(o.x);
  const float* kc = half ? nullptr : c.buf(o.y);
  const float* vc = half ? nullptr : c.buf(o.z);
  const uint16_t* kh = half ? c.hbuf(o.y) : nullptr;
  const uint16_t* vh = half ? c.hbuf(o.z) : nullptr;
  float* out = c.buf(o.out);
  const int64_t qs = c.cols(o.x), ks = c.cols(o.y), vs = c.cols(o.z), os = c.cols(o.out);
  const float scale = static_cast<float>(o.scale), cap = static_cast<float>(o.softcap);
  const int64_t sst = attn_score_stride(c.p), np = attn_pass_heads(o);
  float* score = c.scratch;                                          // [np][sst]
  int32_t* kv_row = reinterpret_cast<int32_t*>(score + np * sst);    // [sst] pool row of each position
  const float** kp = reinterpret_cast<const float**>(kv_row + sst);  // [sst] its K (then V) row (64-byte aligned: sst % 16 == 0)
  float* acc = reinterpret_cast<float*>(kp + sst);                   // [np][hd + 16]
  float* q16 = acc + np * (hd + 16);                                 // [np][hd] the queries rounded to f16
  float* sum = q16 + np * (hd + 16);                                 // [np]
  float* conv = sum + np + 64 - (np + 64) % 16;                      // [kAttnScoreChunk][hd + 16] rows of an f16 cache as floats
  const int64_t cst = hd + 16;
  // Cached positions [j0, j0 + n) of KV group g (K or V): kp[j] the float rows, converted into
  // `conv` from an f16 cache (the same values: they were rounded to f16 when stored), the next
  // chunk's rows prefetched.
  const auto rows_of = [&](bool v, int64_t g, int64_t j0, int64_t n, int64_t n_kv) {
    const int64_t st = v ? vs : ks;
    for (int64_t j = j0 + kAttnScoreChunk; j < std::min(j0 + kAttnScoreChunk + n, n_kv); ++j) {
      if (half) prefetch_halves((v ? vh : kh) + kv_row[j] * st + g * hd, hd);
      else prefetch_floats((v ? vc : kc) + kv_row[j] * st + g * hd, hd);
    }
    for (int64_t j = j0; j < j0 + n; ++j) {
      if (half) {
        kp[j] = conv + (j - j0) * cst;
        f16_to_f32_span((v ? vh : kh) + kv_row[j] * st + g * hd, conv + (j - j0) * cst, hd);
      } else {
        kp[j] = (v ? vc : kc) + kv_row[j] * st + g * hd;
      }
    }
  };
  const auto prefetch_first = [&](bool v, int64_t g, int64_t n_kv) {
    for (int64_t j = 0; j < std::min(kAttnScoreChunk, n_kv); ++j) {
      if (half) prefetch_halves((v ? vh : kh) + kv_row[j] * (v ? vs : ks) + g * hd, hd);
      else prefetch_floats((v ? vc : kc) + kv_row[j] * (v ? vs : ks) + g * hd, hd);
    }
  };
  attn_passes(c, o, in, R, np, kv_row, [&](int64_t r, int64_t n_kv, int64_t g, int64_t ha, int64_t nh) {
    const float* qg = q + r * qs + ha * hd;  // the group's heads are consecutive, hd floats apart
    if (c.m.kv_f16) {
      uint16_t* h16 = reinterpret_cast<uint16_t*>(conv);
      f32_to_f16_span(qg, h16, nh * hd);
      f16_to_f32_span(h16, q16, nh * hd);
      qg = q16;
    }
    prefetch_first(false, g, n_kv);
    for (int64_t j0 = 0; j0 < n_kv; j0 += kAttnScoreChunk) {  // any split gives the same bits
      const int64_t n = std::min(kAttnScoreChunk, n_kv - j0);
      rows_of(false, g, j0, n, n_kv);
      gemm_f32(qg, hd, nh, kp + j0, n, hd, score + j0, sst);
    }
    prefetch_first(true, g, n_kv);
    for (int64_t hh = 0; hh < nh; ++hh) {
      float* sc = score + hh * sst;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n_kv; ++j) {
        sc[j] = attn_score(sc[j], scale, cap);
        mx = std::max(mx, sc[j]);
      }
      exp_sub_span(sc, sc, n_kv, mx);
      float s = 0;
      if (c.m.kv_f16) {  // llama.cpp: softmax (sum in double), then probabilities as f16 against V
        const float inv = static_cast<float>(1.0 / attn_sum_f64(sc, n_kv));
        for (int64_t j = 0; j < n_kv; ++j) sc[j] = round_f16(sc[j] * inv);
        s = 1;
      } else {
        for (int64_t j = 0; j < n_kv; ++j) s += sc[j];
      }
      sum[hh] = s;
    }
    std::fill(acc, acc + nh * cst, 0.0f);
    for (int64_t j0 = 0; j0 < n_kv; j0 += kAttnScoreChunk) {  // positions in order for every element
      const int64_t n = std::min(kAttnScoreChunk, n_kv - j0);
      rows_of(true, g, j0, n, n_kv);
      attn_pv(kp + j0, n, score + j0, sst, nh, hd, acc, cst);
    }
    for (int64_t hh = 0; hh < nh; ++hh) {
      float* oh = out + r * os + (ha + hh) * hd;
      const float* ah = acc + hh * cst;
      for (int64_t i = 0; i < hd; ++i) oh[i] = ah[i] / sum[hh];
    }
  });
}

// Flash-decoding, one (KV group g, split s) tile: for each row, the range s of its positions
// (attn_split_range) and each head of the group, the unnormalised o = sum_j e^(score_j - m) v_j, the
// range's max score m and l = sum_j e^(score_j - m) into the scratch (program.h). An empty range
// writes o = 0, m = -inf, l = 0. kv_f16: the query is rounded to f16 and so are the unnormalised
// probabilities before they weight V (the normalised ones are not known inside one range).
void attention_partial(const Ctx& c, const OpDesc& o, const Instr& in, int64_t R) {
  const int64_t hd = o.head_dim, hpg = o.n_head / o.n_head_kv, S = o.attn_splits, st = attn_partial_stride(o);
  const int64_t t = in.c0 / attn_partial_tile_cols(o), g = t / S, s = t % S;
  const float* q = c.buf(o.x);
  const float* kc = c.buf(o.y);
  const float* vc = c.buf(o.z);
  float* out = c.buf(o.out);
  const int64_t qs = c.cols(o.x), ks = c.cols(o.y), vs = c.cols(o.z), os = c.cols(o.out);
  const float scale = static_cast<float>(o.scale), cap = static_cast<float>(o.softcap);
  float* score = c.scratch;
  int32_t* kv_row = reinterpret_cast<int32_t*>(c.scratch + c.p.n_ctx + 16);
  float* q16 = c.scratch + 2 * (c.p.n_ctx + 16) + hd + 16;
  float* conv = q16 + hd + 16;  // a K or V row of the f16 cache as floats
  const bool half = c.half(o.y);
  const uint16_t* kh = half ? c.hbuf(o.y) : nullptr;
  const uint16_t* vh = half ? c.hbuf(o.z) : nullptr;
  // cached row j's K (V) for KV group g, as floats
  const auto krow = [&](int64_t j) -> const float* {
    if (!half) return kc + kv_row[j] * ks + g * hd;
    f16_to_f32_span(kh + kv_row[j] * ks + g * hd, conv, hd);
    return conv;
  };
  const auto vrow = [&](int64_t j) -> const float* {
    if (!half) return vc + kv_row[j] * vs + g * hd;
    f16_to_f32_span(vh + kv_row[j] * vs + g * hd, conv, hd);
    return conv;
  };
  const auto prefetch = [&](bool v, int64_t j) {
    if (half) prefetch_halves((v ? vh : kh) + kv_row[j] * (v ? vs : ks) + g * hd, hd);
    else prefetch_floats((v ? vc : kc) + kv_row[j] * (v ? vs : ks) + g * hd, hd);
  };
  for (int64_t r = 0; r < R; ++r) {
    const KvRange range = attn_kv_range(c, o, r);
    int64_t lo = 0, hi = 0;
    attn_split_range(range.begin, range.end, s, S, &lo, &hi);
    const int64_t n = hi - lo;
    attn_kv_rows(c, r, lo, hi, kv_row);
    for (int64_t hh = 0; hh < hpg; ++hh) {
      const int64_t h = g * hpg + hh;
      const float* qh = q + r * qs + h * hd;
      if (c.m.kv_f16) {
        for (int64_t i = 0; i < hd; ++i) q16[i] = round_f16(qh[i]);
        qh = q16;
      }
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        if (j + kKvPrefetchAhead < n) prefetch(false, j + kKvPrefetchAhead);
        score[j] = attn_score(dot(qh, krow(j), hd), scale, cap);
        mx = std::max(mx, score[j]);
      }
      float sum = 0;
      exp_sub_span(score, score, n, mx);
      for (int64_t j = 0; j < n; ++j) {
        if (c.m.kv_f16) score[j] = round_f16(score[j]);
        sum += score[j];
      }
      float* oh = out + r * os + in.c0 + hh * st;
      std::fill(oh, oh + hd, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        if (j + kKvPrefetchAhead < n) prefetch(true, j + kKvPrefetchAhead);
        const float* vj = vrow(j);
        const float pj = score[j];
        for (int64_t i = 0; i < hd; ++i) oh[i] += pj * vj[i];
      }
      oh[hd] = mx;
      oh[hd + 1] = sum;
    }
  }
}

// Merges the attn_splits partials of each head of the tile (log-sum-exp rescaling to the largest
// m); empty ranges (l = 0) contribute nothing.
void attention_combine(const Ctx& c, const OpDesc& o, const Instr& in, int64_t R) {
  const int64_t hd = o.head_dim, hpg = o.n_head / o.n_head_kv, S = o.attn_splits, st = attn_partial_stride(o);
  const int64_t tile = attn_partial_tile_cols(o);
  const float* x = c.buf(o.x);
  float* out = c.buf(o.out);
  const int64_t xs = c.cols(o.x), os = c.cols(o.out);
  float* acc = c.scratch;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = in.c0 / hd; h < in.c1 / hd; ++h) {
      const float* base = x + r * xs + (h / hpg) * S * tile + (h % hpg) * st;  // split 0 of head h
      float M = -INFINITY;
      for (int64_t s = 0; s < S; ++s)
        if (base[s * tile + hd + 1] > 0) M = std::max(M, base[s * tile + hd]);
      float L = 0;
      std::fill(acc, acc + hd, 0.0f);
      for (int64_t s = 0; s < S; ++s) {
        const float* ps = base + s * tile;
        if (!(ps[hd + 1] > 0)) continue;
        const float f = exp_f32(ps[hd] - M);
        L += ps[hd + 1] * f;
        for (int64_t i = 0; i < hd; ++i) acc[i] += ps[i] * f;
      }
      float* oh = out + r * os + h * hd;
      for (int64_t i = 0; i < hd; ++i) oh[i] = acc[i] / L;
    }
}

}  // namespace

size_t scratch_floats(const Program& p) {
  int64_t need = 1024;
  for (const OpDesc& o : p.ops) {
    int64_t R = o.rows.eval({p.max_tokens, p.max_tokens});
    int64_t n = 0;
    switch (o.opcode) {
      case Opcode::matmul:
        n = matmul_scratch(R, o.k, o.tile_cols, o.pro_rms).end + 64;
        break;
      case Opcode::attention:
        n = attn_scratch_floats(p, o);
        break;
      case Opcode::moe_matmul:
        n = moe_scratch_floats(o.moe_reduce ? o.k / o.n_expert_used : o.k, o.tile_cols);
        break;
      case Opcode::moe_route:
        n = o.n_expert + 64;
        break;
      case Opcode::attention_partial:
        n = 2 * (p.n_ctx + 16) + 3 * (o.head_dim + 16);  // scores, pool rows (i32), accumulator, f16 query, f16 row
        break;
      case Opcode::attention_combine:
        n = o.head_dim + 16;
        break;
      default:  // + 512: a quantized embedding tile dequantizes whole blocks of up to 256 around it
        n = 3 * o.k + o.tile_cols + 2 * o.n_rot + 160 + 512;
    }
    need = std::max(need, n);
  }
  return static_cast<size_t>(need);
}

size_t act_cache_floats(const Program& p) {
  int64_t need = 0;
  for (const OpDesc& o : p.ops)
    if (o.opcode == Opcode::matmul) {
      const int64_t R = o.rows.eval({p.max_tokens, p.max_tokens});
      need = std::max(need, std::max(act_q8_floats(R, o.k), o.pro_rms ? R * o.k : 0));  // 8-bit rows or float rows
    }
  return static_cast<size_t>(16 + need);  // 16: the (step, op) tag, keeping the rows 64-byte aligned
}

namespace {
// What a matmul's act_cache entry holds: act_q8 with the block types of its weight and up weight,
// or float rows (RMS-normalised) when it has a prologue; cached = false when the op caches nothing.
struct ActPrep {
  bool cached = false, q8 = false;
  const void* aw = nullptr;
  const void* au = nullptr;
};
ActPrep act_prep(const OpDesc& o, const WeightRef* weights) {
  const WeightRef& W = weights[static_cast<size_t>(o.w)];
  const bool q8 = W.act_q8 && (o.glu == Act::none || weights[static_cast<size_t>(o.w_up)].act_q8);
  if (!q8 && !o.pro_rms) return {};
  if (!q8) return {true, false, nullptr, nullptr};
  const void* aw = W.quant->act;
  return {true, true, aw, o.glu != Act::none ? weights[static_cast<size_t>(o.w_up)].quant->act : aw};
}
}  // namespace

std::vector<int32_t> act_cache_keys(const Program& p, const WeightRef* weights) {
  const int32_t n = static_cast<int32_t>(p.ops.size());
  std::vector<int32_t> key(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    key[static_cast<size_t>(i)] = i;
    const OpDesc& o = p.ops[static_cast<size_t>(i)];
    if (o.opcode != Opcode::matmul) continue;
    const ActPrep a = act_prep(o, weights);
    if (!a.cached) continue;
    for (int32_t j = i - 1; j >= 0; --j) {
      const OpDesc& e = p.ops[static_cast<size_t>(j)];
      if (e.out == o.x) break;  // x rewritten: nothing earlier holds these rows
      if (e.opcode != Opcode::matmul || e.x != o.x || !(e.rows == o.rows) || e.k != o.k || e.pro_rms != o.pro_rms) continue;
      if (o.pro_rms && (e.norm_w != o.norm_w || e.eps != o.eps || e.weight_offset != o.weight_offset)) continue;
      const ActPrep b = act_prep(e, weights);
      if (!b.cached || b.q8 != a.q8 || b.aw != a.aw || b.au != a.au) continue;
      key[static_cast<size_t>(i)] = key[static_cast<size_t>(j)];
      break;
    }
  }
  return key;
}

std::vector<int32_t> act_shared_slots(const Program& p, const WeightRef* weights, const std::vector<int32_t>& keys,
                                      int n_slots) {
  const size_t n_ops = p.ops.size(), n_in = p.instrs.size();
  std::vector<int32_t> slot(n_ops, -1);
  if (p.workers < 2 || n_slots < 1) return slot;
  // pred[i]: the instructions i waits for, directly or not (instructions are in topological order)
  const size_t words = (n_in + 63) / 64;
  std::vector<uint64_t> pred(n_in * words, 0);
  std::vector<std::vector<int32_t>> signalers(p.counters.size());
  for (size_t i = 0; i < n_in; ++i)
    if (p.instrs[i].signal >= 0) signalers[static_cast<size_t>(p.instrs[i].signal)].push_back(static_cast<int32_t>(i));
  for (size_t i = 0; i < n_in; ++i) {
    uint64_t* pi = pred.data() + i * words;
    for (const Wait& w : p.instrs[i].waits)
      for (const int32_t j : signalers[static_cast<size_t>(w.counter)]) {
        if (static_cast<size_t>(j) >= i) continue;  // not an earlier instruction: no order to rely on
        const uint64_t* pj = pred.data() + static_cast<size_t>(j) * words;
        for (size_t k = 0; k < words; ++k) pi[k] |= pj[k];
        pi[static_cast<size_t>(j) / 64] |= uint64_t{1} << (j % 64);
      }
  }
  std::vector<std::vector<int32_t>> instrs_of(n_ops);
  for (size_t i = 0; i < n_in; ++i) instrs_of[static_cast<size_t>(p.instrs[i].op)].push_back(static_cast<int32_t>(i));
  // all instructions of ops with key `a` wait for all instructions of ops with key `b`
  const auto after = [&](int32_t a, int32_t b) {
    for (size_t x = 0; x < n_ops; ++x) {
      if (keys[x] != a) continue;
      for (const int32_t ix : instrs_of[x])
        for (size_t y = 0; y < n_ops; ++y) {
          if (keys[y] != b) continue;
          for (const int32_t iy : instrs_of[y])
            if (!(pred[static_cast<size_t>(ix) * words + static_cast<size_t>(iy) / 64] >> (iy % 64) & 1)) return false;
        }
    }
    return true;
  };
  std::vector<int32_t> last(static_cast<size_t>(n_slots), -1);  // the key each slot holds
  int next = 0;
  for (size_t i = 0; i < n_ops; ++i) {
    const OpDesc& o = p.ops[i];
    if (o.opcode != Opcode::matmul || !act_prep(o, weights).q8) continue;
    if (keys[i] != static_cast<int32_t>(i)) {  // shares an earlier op's key (and its slot)
      slot[i] = slot[static_cast<size_t>(keys[i])];
      continue;
    }
    const int s = next;
    if (last[static_cast<size_t>(s)] >= 0 && !after(static_cast<int32_t>(i), last[static_cast<size_t>(s)])) continue;
    slot[i] = s;
    last[static_cast<size_t>(s)] = static_cast<int32_t>(i);
    next = (next + 1) % n_slots;
  }
  return slot;
}

void set_attention_avx512(bool on) {
#if defined(__AVX512F__)
  g_attention_avx512.store(on);
#else
  (void)on;
#endif
}
bool attention_avx512_enabled() { return g_attention_avx512.load(); }

void execute(const Program& p, const Instr& in, const StepMemory& m, float* scratch) {
  const OpDesc& o = p.ops[static_cast<size_t>(in.op)];
  Ctx c{p, m, scratch};
  const int64_t R = o.rows.eval(m.sym);
  const int64_t c0 = in.c0, c1 = in.c1, T = c1 - c0;
  switch (o.opcode) {
    case Opcode::matmul:
      matmul(c, o, in, R);
      return;
    case Opcode::moe_matmul:
      moe_matmul(c, o, in, R);
      return;
    case Opcode::moe_route: {
      const float* x = c.buf(o.x);
      float* out = c.buf(o.out);
      const int64_t xs = c.cols(o.x), os = c.cols(o.out);
      for (int64_t r = 0; r < R; ++r) moe_route_row(x + r * xs, o.n_expert, o.n_expert_used, o.moe_norm, scratch, out + r * os);
      return;
    }
    case Opcode::attention:
      attention(c, o, in, R);
      return;
    case Opcode::attention_partial:
      attention_partial(c, o, in, R);
      return;
    case Opcode::attention_combine:
      attention_combine(c, o, in, R);
      return;
    case Opcode::embed: {
      const int32_t* ids = c.ibuf(o.ids);
      float* out = c.buf(o.out);
      for (int64_t r = 0; r < R; ++r) {
        const float* src = weight_span(c.w(o.w), ids[r], c0, c1, scratch);
        std::memcpy(out + r * o.cols + c0, src, static_cast<size_t>(T) * 4);
      }
      return;
    }
    case Opcode::rms_norm:
    case Opcode::layer_norm: {
      const float* x = c.buf(o.x);
      float* out = c.buf(o.out);
      const float* w = o.norm_w >= 0 ? weight_span(c.w(o.norm_w), 0, 0, o.norm_w >= 0 ? p.weights[static_cast<size_t>(o.norm_w)].shape[0] : 0, scratch) : nullptr;
      float* b_tmp = scratch + o.k + 32;
      const float* b = o.bias >= 0 ? weight_span(c.w(o.bias), 0, 0, o.k, b_tmp) : nullptr;
      float* row = scratch + 2 * (o.k + 32);
      for (int64_t r = 0; r < R; ++r) {
        const float* xr = x + r * o.k;
        if (o.opcode == Opcode::rms_norm) {
          if (o.group == o.k) {
            rms_norm_span(xr, w, o.weight_offset, o.eps, o.k, row);
            std::memcpy(out + r * o.cols + c0, row + c0, static_cast<size_t>(T) * 4);
          } else {
            for (int64_t g = c0; g < c1; g += o.group) rms_norm_span(xr + g, w, o.weight_offset, o.eps, o.group, out + r * o.cols + g);
          }
        } else {
          double mean = 0, var = 0;
          for (int64_t j = 0; j < o.k; ++j) mean += xr[j];
          mean /= static_cast<double>(o.k);
          for (int64_t j = 0; j < o.k; ++j) var += (xr[j] - mean) * (xr[j] - mean);
          var /= static_cast<double>(o.k);
          double inv = 1.0 / std::sqrt(var + o.eps);
          for (int64_t j = c0; j < c1; ++j)
            out[r * o.cols + j] = static_cast<float>((xr[j] - mean) * inv * (w ? w[j] : 1.0) + (b ? b[j] : 0.0));
        }
      }
      return;
    }
    case Opcode::add:
    case Opcode::mul: {
      const float* x = c.buf(o.x);
      float* out = c.buf(o.out);
      const float* y = o.y >= 0 ? c.buf(o.y) : nullptr;
      const float* bias = o.bias >= 0 ? weight_span(c.w(o.bias), 0, c0, c1, scratch) : nullptr;
      for (int64_t r = 0; r < R; ++r) {
        const float* xr = x + r * o.cols;
        const float* yr = y ? y + r * o.cols + c0 : bias;
        float* orow = out + r * o.cols;
        if (o.opcode == Opcode::add)
          for (int64_t j = 0; j < T; ++j) orow[c0 + j] = xr[c0 + j] + yr[j];
        else
          for (int64_t j = 0; j < T; ++j) orow[c0 + j] = xr[c0 + j] * yr[j];
      }
      return;
    }
    case Opcode::scale:
    case Opcode::silu:
    case Opcode::gelu:
    case Opcode::gelu_tanh:
    case Opcode::softcap: {
      const float* x = c.buf(o.x);
      float* out = c.buf(o.out);
      const float s = static_cast<float>(o.scale), cap = static_cast<float>(o.softcap);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = c0; j < c1; ++j) {
          float v = x[r * o.cols + j];
          out[r * o.cols + j] = o.opcode == Opcode::scale ? v * s : o.opcode == Opcode::silu ? silu_f32(v)
                                : o.opcode == Opcode::gelu ? gelu_erf(v)
                                : o.opcode == Opcode::gelu_tanh ? (c.m.gelu_f16 ? gelu_ggml(v) : gelu_tanh_approx(v))
                                                                                                          : softcap(v, cap);
        }
      return;
    }
    case Opcode::rope: {
      const float* x = c.buf(o.x);
      float* out = c.buf(o.out);
      const int32_t* pos = c.ibuf(o.pos);
      for (int64_t r = 0; r < R; ++r) {
        std::memcpy(out + r * o.cols + c0, x + r * o.cols + c0, static_cast<size_t>(T) * 4);
        rope_span(o, out + r * o.cols + c0, c0, T, r, pos[r]);
      }
      return;
    }
    case Opcode::kv_store: {
      const float* x = c.buf(o.x);
      const int64_t xs = c.cols(o.x), cs = c.cols(o.out);
      const int32_t* slot = c.ibuf(p.kv_slot_buffer);
      for (int64_t r = 0; r < R; ++r) {
        if (c.half(o.out)) f32_to_f16_span(x + r * xs + c0, c.hbuf(o.out) + slot[r] * cs + c0, T);
        else std::memcpy(c.buf(o.out) + slot[r] * cs + c0, x + r * xs + c0, static_cast<size_t>(T) * 4);
      }
      return;
    }
    case Opcode::last_row: {
      const float* x = c.buf(o.x);
      float* out = c.buf(o.out);
      const int32_t* rows = c.ibuf(p.logit_rows_buffer);  // R = n_out rows, each a row of x
      for (int64_t r = 0; r < R; ++r)
        std::memcpy(out + r * o.cols + c0, x + rows[r] * o.cols + c0, static_cast<size_t>(T) * 4);
      return;
    }
    case Opcode::argmax: {
      const float* x = c.buf(o.x);
      int32_t* out = const_cast<int32_t*>(c.ibuf(o.out));
      const int64_t xs = c.cols(o.x);
      for (int64_t r = 0; r < R; ++r) {
        const GreedyRow g = greedy_row(std::span<const float>(x + r * xs, static_cast<size_t>(o.k)));
        const int32_t v[4] = {g.id, g.n_nonfinite, g.first_nonfinite, std::bit_cast<int32_t>(g.first_value)};
        for (int64_t j = c0; j < c1; ++j) out[r * 4 + j] = v[j];
      }
      return;
    }
    case Opcode::topk: {
      if (!m.want_topk) return;
      const float* x = c.buf(o.x);
      int32_t* out = const_cast<int32_t*>(c.ibuf(o.out));
      const int64_t xs = c.cols(o.x), k = (o.cols - 4) / 2;
      std::vector<int32_t> v(static_cast<size_t>(o.cols));
      for (int64_t r = 0; r < R; ++r) {
        encode_topk_row(topk_row(std::span<const float>(x + r * xs, static_cast<size_t>(o.k)), k), k, v.data());
        for (int64_t j = c0; j < c1; ++j) out[r * o.cols + j] = v[static_cast<size_t>(j)];
      }
      return;
    }
  }
  MK_CHECK(false, "cpu: opcode {} has no implementation", opcode_name(o.opcode));
}

}  // namespace mk::cpu
