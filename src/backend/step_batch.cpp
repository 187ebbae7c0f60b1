#include "backend/step_batch.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <unordered_map>

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 warns "'__Y' may be used uninitialized" inside its own AVX-512 intrinsic headers (GCC bug
// 105593), as in quant/avx2.h: silenced for the header only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "support/error.h"

namespace mk {

StepInputs prepare_step(const StepBatch& b, const StepLimits& l) {
  const int64_t n = b.n_rows();
  if (n < 1 || (l.max_rows > 0 && n > l.max_rows))
    fail("step batch: {} rows (this program runs 1..{} rows per step)", n, l.max_rows);
  if (static_cast<int64_t>(b.positions.size()) != n || static_cast<int64_t>(b.seq.size()) != n)
    fail("step batch: {} tokens but {} positions and {} sequence indices (one of each per row)", n, b.positions.size(),
         b.seq.size());
  const int64_t n_tables = static_cast<int64_t>(b.block_tables.size());
  StepInputs s;
  s.tokens = b.tokens;
  s.positions = b.positions;
  s.row_seq.resize(static_cast<size_t>(n));
  std::unordered_map<int32_t, int32_t> compact;  // batch sequence -> row of the flat block table
  std::vector<int32_t> seqs;                       // flat row -> batch sequence
  std::vector<int32_t> max_pos;                    // flat row -> its last position in the step
  std::vector<int32_t> first_pos;                  // flat row -> its first position in the step
  for (int64_t r = 0; r < n; ++r) {
    const int32_t sq = b.seq[static_cast<size_t>(r)], pos = b.positions[static_cast<size_t>(r)];
    if (sq < 0 || sq >= n_tables) fail("step batch: row {}: sequence {} out of range (block_tables has {})", r, sq, n_tables);
    if (pos < 0 || (l.n_ctx > 0 && pos >= l.n_ctx))
      fail("step batch: row {}: position {} outside the context [0, {})", r, pos, l.n_ctx);
    const bool continues = r > 0 && b.seq[static_cast<size_t>(r - 1)] == sq;
    if (continues) {
      if (pos != b.positions[static_cast<size_t>(r - 1)] + 1)
        fail("step batch: row {}: position {} does not follow {} (positions of a sequence must be consecutive)", r, pos,
             b.positions[static_cast<size_t>(r - 1)]);
    } else {
      if (compact.count(sq)) fail("step batch: row {}: sequence {} appears again after other rows (a sequence's rows must be consecutive)", r, sq);
      compact.emplace(sq, static_cast<int32_t>(seqs.size()));
      seqs.push_back(sq);
      max_pos.push_back(pos);
      first_pos.push_back(pos);
    }
    const int32_t f = compact.at(sq);
    s.row_seq[static_cast<size_t>(r)] = f;
    max_pos[static_cast<size_t>(f)] = pos;
  }
  s.n_seqs = static_cast<int64_t>(seqs.size());
  if (l.block_size > 0) {
    const int64_t mb = l.max_blocks_per_seq, B = l.block_size;
    s.block_table.assign(static_cast<size_t>(s.n_seqs * mb), 0);
    for (int64_t f = 0; f < s.n_seqs; ++f) {
      const auto& t = b.block_tables[static_cast<size_t>(seqs[static_cast<size_t>(f)])];
      const int64_t need = max_pos[static_cast<size_t>(f)] / B + 1;  // blocks holding positions [0, max]
      if (static_cast<int64_t>(t.size()) < need)
        fail("step batch: sequence {} has {} blocks, position {} needs {}", seqs[static_cast<size_t>(f)], t.size(),
             max_pos[static_cast<size_t>(f)], need);
      for (int64_t j = 0; j < need; ++j) {
        const int32_t blk = t[static_cast<size_t>(j)];
        if (blk < 0 || blk >= l.pool_blocks)
          fail("step batch: sequence {} block {} is {}, outside the pool of {} blocks", seqs[static_cast<size_t>(f)], j, blk,
               l.pool_blocks);
        s.block_table[static_cast<size_t>(f * mb + j)] = blk;
      }
    }
    s.kv_slot.resize(static_cast<size_t>(n));
    std::unordered_map<int32_t, int64_t> writer;  // slot -> row
    for (int64_t r = 0; r < n; ++r) {
      const int64_t pos = b.positions[static_cast<size_t>(r)];
      const int64_t blk = s.block_table[static_cast<size_t>(s.row_seq[static_cast<size_t>(r)] * mb + pos / B)];
      const auto slot = static_cast<int32_t>(blk * B + pos % B);
      auto [it, fresh] = writer.emplace(slot, r);
      if (!fresh) fail("step batch: rows {} and {} write the same KV slot {} (their sequences share a block)", it->second, r, slot);
      s.kv_slot[static_cast<size_t>(r)] = slot;
    }
    if (l.written) {
      std::vector<int32_t>& w = l.written->rows;
      if (static_cast<int64_t>(w.size()) != l.pool_blocks) w.assign(static_cast<size_t>(l.pool_blocks), 0);
      // Positions [0, first) of each sequence: whole blocks before the first row's, then its block's head.
      for (int64_t f = 0; f < s.n_seqs; ++f) {
        const int64_t first = first_pos[static_cast<size_t>(f)];
        for (int64_t j = 0; j <= first / B; ++j) {
          const int32_t blk = s.block_table[static_cast<size_t>(f * mb + j)];
          const int64_t need = j < first / B ? B : first % B, have = w[static_cast<size_t>(blk)];
          if (have < need)
            fail("internal error: step batch: sequence {} starts at position {} but its position {} (block {}, row {} of "
                 "pool block {}) was never written; the scheduler lost track of its KV cache",
                 seqs[static_cast<size_t>(f)], first, j * B + have, j, have, blk);
        }
      }
    }
  }
  for (size_t i = 0; i < b.logit_rows.size(); ++i) {
    const int32_t r = b.logit_rows[i];
    if (r < 0 || r >= n || (i > 0 && r <= b.logit_rows[i - 1]))
      fail("step batch: logit_rows[{}] = {}: logit rows must be ascending row indices in [0, {})", i, r, n);
  }
  s.logit_rows = b.logit_rows.empty() ? std::vector<int32_t>{static_cast<int32_t>(n - 1)} : b.logit_rows;
  if (l.written && l.block_size > 0)  // the batch is good: its rows are written this step
    for (int64_t r = 0; r < n; ++r)
      l.written->rows[static_cast<size_t>(s.kv_slot[static_cast<size_t>(r)] / l.block_size)] =
          static_cast<int32_t>(b.positions[static_cast<size_t>(r)] % l.block_size + 1);
  return s;
}

namespace {
template <class T>
std::vector<T> select_rows(std::span<const T> out, int64_t rows, int64_t cols, const StepBatch& batch, const StepInputs& in) {
  std::vector<T> r;
  if (batch.logit_rows.empty()) return r;
  MK_CHECK(rows == in.n_out() || rows == in.n_rows(), "step output has {} rows for {} rows, {} wanted", rows, in.n_rows(),
           in.n_out());
  MK_CHECK(static_cast<int64_t>(out.size()) >= rows * cols);
  if (rows == in.n_out()) return {out.begin(), out.begin() + rows * cols};
  for (int32_t row : batch.logit_rows) r.insert(r.end(), out.begin() + row * cols, out.begin() + (row + 1) * cols);
  return r;
}
}  // namespace

std::vector<float> select_logit_rows(std::span<const float> out, int64_t rows, int64_t cols, const StepBatch& batch,
                                     const StepInputs& in) {
  return select_rows(out, rows, cols, batch, in);
}

std::vector<int32_t> select_logit_rows(std::span<const int32_t> out, int64_t rows, int64_t cols, const StepBatch& batch,
                                       const StepInputs& in) {
  return select_rows(out, rows, cols, batch, in);
}

const char* output_name(OutputKind kind) { return kind == OutputKind::greedy ? "greedy" : "topk"; }

int64_t output_row_words(OutputKind kind, int64_t k) { return kind == OutputKind::greedy ? 4 : 4 + 2 * k; }

void encode_output_row(OutputKind kind, std::span<const float> logits, int64_t k, int32_t* out) {
  if (kind == OutputKind::greedy)
    encode_greedy_row(greedy_row(logits), out);
  else
    encode_topk_row(topk_row(logits, k), k, out);
}

StepInputs one_sequence_step(std::span<const int32_t> tokens, int64_t n_past, const StepLimits& l, bool all_rows) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (l.block_size > 0 && n_past + n > l.pool_blocks * l.block_size)
    fail("context overflow: {} tokens in the cache + {} new > the KV pool of {} rows (kv_pool_tokens)", n_past, n,
         l.pool_blocks * l.block_size);
  return prepare_step(one_sequence_batch(tokens, n_past, l.block_size, all_rows), l);
}

StepBatch one_sequence_batch(std::span<const int32_t> tokens, int64_t n_past, int64_t block_size, bool all_rows) {
  StepBatch b;
  const auto n = static_cast<int64_t>(tokens.size());
  b.tokens.assign(tokens.begin(), tokens.end());
  b.seq.assign(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) b.positions.push_back(static_cast<int32_t>(n_past + i));
  if (all_rows)
    for (int64_t i = 0; i < n; ++i) b.logit_rows.push_back(static_cast<int32_t>(i));
  else if (n > 0)
    b.logit_rows.push_back(static_cast<int32_t>(n - 1));
  b.block_tables.resize(1);
  if (block_size > 0)
    for (int64_t j = 0; j * block_size < n_past + n; ++j) b.block_tables[0].push_back(static_cast<int32_t>(j));
  return b;
}

GreedyRow greedy_row_portable(std::span<const float> logits) {
  GreedyRow g;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (!std::isfinite(v) && g.n_nonfinite++ == 0) {
      g.first_nonfinite = static_cast<int32_t>(i);
      g.first_value = v;
    }
    if (!std::isnan(v) && (g.id < 0 || v > logits[static_cast<size_t>(g.id)])) g.id = static_cast<int32_t>(i);
  }
  return g;
}

#if defined(__x86_64__) && defined(__GNUC__)
// All values finite: the maximum m (vmaxps; which zero it returns for +-0 does not matter, as -0 ==
// +0), then the first index whose value == m, which is the scalar pass's id (it moves only on a
// strictly greater value, so it keeps the first of the values equal to the maximum).
__attribute__((target("avx512f"))) GreedyRow greedy_row_avx512(std::span<const float> logits) {
  const float* x = logits.data();
  const int64_t n = static_cast<int64_t>(logits.size());
  if (n == 0) return greedy_row_portable(logits);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), max_finite = _mm512_set1_epi32(0x7f7fffff);
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 bad = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    mx = _mm512_max_ps(mx, v);
    bad |= _mm512_cmpgt_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), abs_mask), max_finite);
  }
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
  if (tail) {
    const __m512 v = _mm512_maskz_loadu_ps(tail, x + i);
    mx = _mm512_mask_max_ps(mx, tail, mx, v);
    bad |= _mm512_mask_cmpgt_epi32_mask(tail, _mm512_and_si512(_mm512_castps_si512(v), abs_mask), max_finite);
  }
  if (bad) return greedy_row_portable(logits);  // a NaN or an infinity: counted and reported there
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  GreedyRow g;
  for (i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __mmask16 eq = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, x + i), m, _CMP_EQ_OQ);
    if (eq) {
      g.id = static_cast<int32_t>(i + __builtin_ctz(eq));
      break;
    }
  }
  return g;
}
bool greedy_row_avx512_available() {
  static const bool have = __builtin_cpu_supports("avx512f");
  return have;
}
#else
GreedyRow greedy_row_avx512(std::span<const float> logits) { return greedy_row_portable(logits); }
bool greedy_row_avx512_available() { return false; }
#endif

GreedyRow greedy_row(std::span<const float> logits) {
  static const bool avx512 = greedy_row_avx512_available();
  return avx512 ? greedy_row_avx512(logits) : greedy_row_portable(logits);
}

void encode_greedy_row(const GreedyRow& g, int32_t* out) {
  out[0] = g.id;
  out[1] = g.n_nonfinite;
  out[2] = g.first_nonfinite;
  out[3] = std::bit_cast<int32_t>(g.first_value);
}

GreedyRow decode_greedy_row(std::span<const int32_t> w) {
  MK_CHECK(w.size() == 4, "greedy row of {} words", w.size());
  return GreedyRow{w[0], w[1], w[2], std::bit_cast<float>(w[3])};
}

TopKRow topk_row(std::span<const float> logits, int64_t k) {
  TopKRow t;
  const size_t kk = static_cast<size_t>(std::max<int64_t>(k, 0));
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  // One pass: candidates go to `buf`; when it holds 4k, the k best are kept and the k-th best
  // becomes the bar a later value must pass (strictly greater: a tie loses to the lower index).
  std::vector<int32_t> buf;
  buf.reserve(4 * kk + 1);
  bool have_bar = false;
  float bar = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (!std::isfinite(v)) {
      if (t.n_nonfinite++ == 0) {
        t.first_nonfinite = static_cast<int32_t>(i);
        t.first_value = v;
      }
      if (std::isnan(v)) continue;
    }
    if (kk == 0 || (have_bar && !(v > bar))) continue;
    buf.push_back(static_cast<int32_t>(i));
    if (buf.size() >= 4 * kk) {
      std::nth_element(buf.begin(), buf.begin() + static_cast<long>(kk - 1), buf.end(), by_logit);
      buf.resize(kk);
      bar = logits[static_cast<size_t>(buf[kk - 1])];
      have_bar = true;
    }
  }
  const size_t n = std::min(buf.size(), kk);
  std::partial_sort(buf.begin(), buf.begin() + static_cast<long>(n), buf.end(), by_logit);
  t.ids.assign(buf.begin(), buf.begin() + static_cast<long>(n));
  for (int32_t i : t.ids) t.logits.push_back(logits[static_cast<size_t>(i)]);
  return t;
}

void encode_topk_row(const TopKRow& t, int64_t k, int32_t* out) {
  MK_CHECK(static_cast<int64_t>(t.ids.size()) <= k && t.ids.size() == t.logits.size());
  out[0] = static_cast<int32_t>(t.ids.size());
  out[1] = t.n_nonfinite;
  out[2] = t.first_nonfinite;
  out[3] = std::bit_cast<int32_t>(t.first_value);
  for (int64_t j = 0; j < k; ++j) {
    const bool has = j < static_cast<int64_t>(t.ids.size());
    out[4 + 2 * j] = has ? t.ids[static_cast<size_t>(j)] : -1;
    out[5 + 2 * j] = has ? std::bit_cast<int32_t>(t.logits[static_cast<size_t>(j)]) : 0;
  }
}

TopKRow decode_topk_row(std::span<const int32_t> w) {
  MK_CHECK(w.size() >= 4 && w.size() % 2 == 0, "topk row of {} words", w.size());
  const auto k = static_cast<int32_t>((w.size() - 4) / 2);
  MK_CHECK(w[0] >= 0 && w[0] <= k, "topk row: {} candidates for k = {}", w[0], k);
  TopKRow t;
  t.n_nonfinite = w[1];
  t.first_nonfinite = w[2];
  t.first_value = std::bit_cast<float>(w[3]);
  for (int32_t j = 0; j < w[0]; ++j) {
    t.ids.push_back(w[static_cast<size_t>(4 + 2 * j)]);
    t.logits.push_back(std::bit_cast<float>(w[static_cast<size_t>(5 + 2 * j)]));
  }
  return t;
}

}  // namespace mk
