// The reference backend: executes the Graph op by op in float32 with float64 accumulation in
// reductions. Simple and obviously right: the oracle every other backend is compared with.
#include <cmath>
#include <map>
#include <unordered_map>

#include "backend/backend.h"
#include "ir/ops.h"
#include "support/error.h"

namespace mk {

namespace {

class ReferenceBackend final : public Backend {
 public:
  ReferenceBackend(const Graph& g, const ModelFile& m) : g_(g), m_(m) {
    verify_graph(g_);
    last_use_.assign(static_cast<size_t>(g_.size()), -1);
    for (const Node& n : g_.nodes)
      for (int i : n.inputs) last_use_[static_cast<size_t>(i)] = n.id;
    all_rows_ = !g_.outputs.empty() && g_[g_.outputs[0].value].op != Op::last_row;
    for (const Node& n : g_.nodes) {
      if (n.op == Op::kv_cache) {
        const KvGeometry kv = kv_geometry(n);
        limits_.n_ctx = n_ctx_ = kv.n_ctx;
        limits_.block_size = kv.block_size;
        limits_.pool_blocks = kv.pool_blocks();
        limits_.max_blocks_per_seq = kv.max_blocks_per_seq();
        limits_.written = &written_;
        caches_[n.id].assign(static_cast<size_t>(n.shape[0].c * n.shape[1].c), 0.0f);
      }
      if (n.op == Op::weight) {
        const WeightTensor& t = m_.get(n.weight);
        if (t.dtype != n.dtype) fail("{}: graph expects {}, file has {}", n.weight, dtype_name(n.dtype), dtype_name(t.dtype));
      }
    }
  }

  std::string name() const override { return "reference"; }

  void reset() override {
    for (auto& [id, c] : caches_) std::fill(c.begin(), c.end(), 0.0f);
    written_.clear();
  }

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_past) override {
    const int64_t n_tokens = static_cast<int64_t>(tokens.size());
    if (n_tokens <= 0) fail("forward: no tokens");
    if (n_ctx_ > 0 && n_past + n_tokens > n_ctx_)
      fail("context overflow: {} tokens in the cache + {} new > context length {}", n_past, n_tokens, n_ctx_);
    StepLimits one = limits_;
    one.max_rows = 0;  // the oracle takes a whole prompt in one step
    return run(one_sequence_step(tokens, n_past, one, all_rows_));
  }

  std::vector<float> forward(const StepBatch& batch) override {
    StepInputs in = prepare_step(batch, limits_);
    std::vector<float> out = run(in);
    const int64_t cols = g_[g_.outputs.at(0).value].shape[1].c;
    return select_logit_rows(out, static_cast<int64_t>(out.size()) / cols, cols, batch, in);
  }
  std::vector<int32_t> forward_rows(const StepBatch& batch, OutputKind kind) override {
    int64_t cols = 0;  // a graph without the argmax / topk op: compute the rows from the logits here
    for (const auto& o : g_.outputs)
      if (o.name == output_name(kind)) cols = g_[o.value].shape[1].c;
    if (cols == 0) return Backend::forward_rows(batch, kind);
    StepInputs in = prepare_step(batch, limits_);
    run(in);
    const std::vector<int32_t>& words = int_outputs_.at(output_name(kind));
    return select_logit_rows(std::span<const int32_t>(words), static_cast<int64_t>(words.size()) / cols, cols, batch, in);
  }
  int64_t kv_block_size() const override { return limits_.block_size; }
  int64_t kv_pool_blocks() const override { return limits_.pool_blocks; }
  int64_t max_batch_rows() const override { return limits_.max_rows; }

 private:
  std::vector<float> run(const StepInputs& step) {
    const int64_t n_tokens = step.n_rows();
    SymValues sym{n_tokens, step.n_out()};
    std::vector<std::vector<float>> val(static_cast<size_t>(g_.size()));  // owned results
    std::vector<const float*> ptr(static_cast<size_t>(g_.size()), nullptr);   // what readers see
    std::vector<size_t> len(static_cast<size_t>(g_.size()), 0);
    std::vector<std::vector<int32_t>> ival(static_cast<size_t>(g_.size()));
    for (const Node& n : g_.nodes) {
      auto& out = val[static_cast<size_t>(n.id)];
      auto in = [&](int i) -> const float* { return ptr[static_cast<size_t>(n.inputs[static_cast<size_t>(i)])]; };
      auto in_len = [&](int i) { return len[static_cast<size_t>(n.inputs[static_cast<size_t>(i)])]; };
      auto in_node = [&](int i) -> const Node& { return g_[n.inputs[static_cast<size_t>(i)]]; };
      const int64_t rows = n.shape.empty() ? 0 : n.shape[0].eval(sym);
      const int64_t cols = n.shape.size() > 1 ? n.shape[1].eval(sym) : 1;
      switch (n.op) {
        case Op::input: {
          auto& iv = ival[static_cast<size_t>(n.id)];
          iv.resize(static_cast<size_t>(n_tokens));
          iv = n.attr_str("kind") == "positions" ? step.positions : step.tokens;
          break;
        }
        case Op::weight: {
          const WeightTensor& t = m_.get(n.weight);
          if (t.dtype == DType::F32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0) {
            ptr[static_cast<size_t>(n.id)] = reinterpret_cast<const float*>(t.data);
            len[static_cast<size_t>(n.id)] = static_cast<size_t>(t.numel());
            continue;
          }
          const std::vector<float>& w = weight_f32(n);
          ptr[static_cast<size_t>(n.id)] = w.data();
          len[static_cast<size_t>(n.id)] = w.size();
          continue;
        }
        case Op::kv_cache: break;
        case Op::embed: {
          const float* table = in(0);
          const auto& ids = ival[static_cast<size_t>(n.inputs[1])];
          int64_t n_rows = in_node(0).shape[0].c;
          out.resize(static_cast<size_t>(rows * cols));
          for (int64_t r = 0; r < rows; ++r) {
            int32_t id = ids[static_cast<size_t>(r)];
            if (id < 0 || id >= n_rows) fail("{}: id {} out of range [0, {})", n.name.empty() ? "embed" : n.name, id, n_rows);
            std::copy_n(table + id * cols, cols, out.begin() + r * cols);
          }
          break;
        }
        case Op::rms_norm: {
          const float* x = in(0);
          int64_t group = n.attr_int("group", cols);
          double eps = n.attr_float("eps"), off = n.attr_float("weight_offset", 0.0);
          const float* w = n.inputs.size() > 1 ? in(1) : nullptr;
          out.resize(static_cast<size_t>(rows * cols));
          for (int64_t base = 0; base < rows * cols; base += group) {
            double ss = 0;
            for (int64_t j = 0; j < group; ++j) ss += static_cast<double>(x[base + j]) * x[base + j];
            double inv = 1.0 / std::sqrt(ss / static_cast<double>(group) + eps);
            for (int64_t j = 0; j < group; ++j)
              out[base + j] = static_cast<float>(x[base + j] * inv * (w ? w[j] + off : 1.0));
          }
          break;
        }
        case Op::layer_norm: {
          const float* x = in(0);
          double eps = n.attr_float("eps");
          const float* w = n.inputs.size() > 1 ? in(1) : nullptr;
          const float* b = n.inputs.size() > 2 ? in(2) : nullptr;
          out.resize(static_cast<size_t>(rows * cols));
          for (int64_t r = 0; r < rows; ++r) {
            const float* xr = &x[r * cols];
            double mean = 0, var = 0;
            for (int64_t j = 0; j < cols; ++j) mean += xr[j];
            mean /= static_cast<double>(cols);
            for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mean) * (xr[j] - mean);
            var /= static_cast<double>(cols);
            double inv = 1.0 / std::sqrt(var + eps);
            for (int64_t j = 0; j < cols; ++j)
              out[r * cols + j] = static_cast<float>((xr[j] - mean) * inv * (w ? w[j] : 1.0) + (b ? b[j] : 0.0));
          }
          break;
        }
        case Op::matmul: {
          const float* x = in(0);
          const float* w = in(1);
          int64_t k = in_node(0).shape[1].eval(sym);
          out.resize(static_cast<size_t>(rows * cols));
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
              const float* xr = &x[r * k];
              const float* wr = &w[c * k];
              double acc = 0;
              for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(xr[i]) * wr[i];
              out[r * cols + c] = static_cast<float>(acc);
            }
          break;
        }
        case Op::moe_route: {
          const float* x = in(0);
          const int64_t n_expert = in_node(0).shape[1].c, k = cols / 2;
          std::vector<float> e(static_cast<size_t>(n_expert));
          out.resize(static_cast<size_t>(rows * cols));
          for (int64_t r = 0; r < rows; ++r)
            moe_route_row(x + r * n_expert, n_expert, k, n.attr_int("norm", 1) != 0, e.data(), &out[static_cast<size_t>(r * cols)]);
          break;
        }
        case Op::moe_matmul: {  // in double, as matmul; the slots' weighted results added in slot order
          const float* x = in(0);
          const float* w = in(1);
          const float* route = in(2);
          const Node& wn = in_node(1);
          const int64_t n_expert = wn.shape[0].c, n_w = wn.shape[1].c, K = wn.shape[2].c;
          const int64_t k = in_node(2).shape[1].c / 2, xc = in_node(0).shape[1].c;
          const bool reduce = n.attr_int("reduce", 0) != 0;
          const float* w_up = n.inputs.size() > 3 ? in(3) : nullptr;  // a GLU (the fuse pass's; not in the graphs run here)
          const std::string glu = w_up ? n.attr_str("glu") : "";
          out.assign(static_cast<size_t>(rows * cols), 0.0f);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < k; ++j) {
              const int64_t e = static_cast<int64_t>(route[r * 2 * k + j]);
              if (e < 0 || e >= n_expert) fail("{}: expert {} out of range [0, {})", n.name, e, n_expert);
              const float* xr = x + r * xc + (reduce ? j * K : 0);
              for (int64_t c = 0; c < n_w; ++c) {
                const float* wr = w + (e * n_w + c) * K;
                double acc = 0;
                for (int64_t i = 0; i < K; ++i) acc += static_cast<double>(xr[i]) * wr[i];
                if (w_up) {
                  const float* ur = w_up + (e * n_w + c) * K;
                  double u = 0;
                  for (int64_t i = 0; i < K; ++i) u += static_cast<double>(xr[i]) * ur[i];
                  const float g = static_cast<float>(acc);
                  acc = (glu == "silu" ? silu(g) : glu == "gelu" ? gelu_erf(g) : gelu_tanh_approx(g)) * static_cast<float>(u);
                }
                if (reduce)
                  out[static_cast<size_t>(r * cols + c)] += static_cast<float>(acc) * route[r * 2 * k + k + j];
                else
                  out[static_cast<size_t>(r * cols + j * n_w + c)] = static_cast<float>(acc);
              }
            }
          break;
        }
        case Op::add:
        case Op::mul: {
          const float* a = in(0);
          const float* b = in(1);
          bool bias = in_node(1).shape.size() == 1;
          out.resize(static_cast<size_t>(rows * cols));
          for (int64_t i = 0; i < rows * cols; ++i) {
            float bv = bias ? b[i % cols] : b[i];
            out[i] = n.op == Op::add ? a[i] + bv : a[i] * bv;
          }
          break;
        }
        case Op::scale: {
          float s = static_cast<float>(n.attr_float("s"));
          out.assign(in(0), in(0) + in_len(0));
          for (auto& v : out) v *= s;
          break;
        }
        case Op::softcap: {
          const double cap = n.attr_float("cap");
          out.assign(in(0), in(0) + in_len(0));
          for (auto& v : out) v = static_cast<float>(cap * std::tanh(v / cap));
          break;
        }
        case Op::silu:
        case Op::gelu:
        case Op::gelu_tanh: {
          out.assign(in(0), in(0) + in_len(0));
          for (auto& v : out) v = n.op == Op::silu ? silu(v) : n.op == Op::gelu ? gelu_erf(v) : gelu_tanh_approx(v);
          break;
        }
        case Op::rope: {
          out.assign(in(0), in(0) + in_len(0));
          const auto& pos = ival[static_cast<size_t>(n.inputs[1])];
          int64_t hd = n.attr_int("head_dim"), n_rot = n.attr_int("n_rot", hd);
          bool halves = n.attr_str("mode") == "halves";
          std::vector<double> inv_freq = rope_inv_freq(n);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t h = 0; h < cols / hd; ++h) {
              float* v = &out[r * cols + h * hd];
              for (int64_t i = 0; i < n_rot / 2; ++i) {
                double ang = static_cast<double>(pos[static_cast<size_t>(r)]) * inv_freq[static_cast<size_t>(i)];
                double c = std::cos(ang), s = std::sin(ang);
                int64_t i0 = halves ? i : 2 * i, i1 = halves ? i + n_rot / 2 : 2 * i + 1;
                double x0 = v[i0], x1 = v[i1];
                v[i0] = static_cast<float>(x0 * c - x1 * s);
                v[i1] = static_cast<float>(x0 * s + x1 * c);
              }
            }
          break;
        }
        case Op::kv_store: {
          auto& cache = caches_.at(n.inputs[1]);  // row r goes to pool row kv_slot[r]
          for (int64_t r = 0; r < n_tokens; ++r)
            std::copy_n(in(0) + r * cols, cols, cache.begin() + step.kv_slot[static_cast<size_t>(r)] * cols);
          ptr[static_cast<size_t>(n.id)] = cache.data();  // readers see the pool itself
          len[static_cast<size_t>(n.id)] = cache.size();
          continue;
        }
        case Op::attention: {
          const float* q = in(0);
          const float* k = in(1);
          const float* v = in(2);
          int64_t nh = n.attr_int("n_head"), nkv = n.attr_int("n_head_kv"), hd = n.attr_int("head_dim");
          double scale = n.attr_float("scale");
          const int64_t window = n.attr_int("window", 0);  // sliding window (0 = none)
          const double cap = n.attr_float("softcap", 0.0);  // score soft-capping (0 = none)
          int64_t kv_cols = nkv * hd;
          out.assign(static_cast<size_t>(rows * cols), 0.0f);
          std::vector<double> score;
          std::vector<int64_t> kv_row;
          const int64_t B = limits_.block_size;
          for (int64_t t = 0; t < rows; ++t) {
            // causal: row t sees positions [0, positions[t]] of its sequence, through its block table;
            // with a sliding window only the last `window` of them: [positions[t] - window + 1, positions[t]]
            const int64_t p = step.positions[static_cast<size_t>(t)];
            const int64_t j0 = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
            int64_t n_kv = p + 1 - j0;
            const int32_t* bt = &step.block_table[static_cast<size_t>(step.row_seq[static_cast<size_t>(t)] * limits_.max_blocks_per_seq)];
            kv_row.resize(static_cast<size_t>(n_kv));
            for (int64_t j = 0; j < n_kv; ++j) kv_row[static_cast<size_t>(j)] = bt[(j0 + j) / B] * B + (j0 + j) % B;
            score.resize(static_cast<size_t>(n_kv));
            for (int64_t h = 0; h < nh; ++h) {
              int64_t hk = h / (nh / nkv);
              const float* qh = &q[t * cols + h * hd];
              double mx = -INFINITY;
              for (int64_t j = 0; j < n_kv; ++j) {
                const float* kj = &k[kv_row[static_cast<size_t>(j)] * kv_cols + hk * hd];
                double d = 0;
                for (int64_t i = 0; i < hd; ++i) d += static_cast<double>(qh[i]) * kj[i];
                score[j] = cap > 0 ? cap * std::tanh(d * scale / cap) : d * scale;
                mx = std::max(mx, score[j]);
              }
              double sum = 0;
              for (auto& s : score) sum += (s = std::exp(s - mx));
              float* oh = &out[t * cols + h * hd];
              for (int64_t i = 0; i < hd; ++i) {
                double acc = 0;
                for (int64_t j = 0; j < n_kv; ++j) acc += score[j] * v[kv_row[static_cast<size_t>(j)] * kv_cols + hk * hd + i];
                oh[i] = static_cast<float>(acc / sum);
              }
            }
          }
          break;
        }
        case Op::last_row: {
          const float* x = in(0);  // the rows logit_rows lists
          for (int32_t r : step.logit_rows) out.insert(out.end(), x + r * cols, x + (r + 1) * cols);
          break;
        }
        case Op::argmax:  // one row per logits row, as the backends' ops encode it
        case Op::topk: {
          const float* x = in(0);
          const OutputKind kind = n.op == Op::argmax ? OutputKind::greedy : OutputKind::topk;
          const int64_t k = in_node(0).shape[1].c, kk = n.op == Op::topk ? n.attr_int("k") : 0;
          auto& iv = ival[static_cast<size_t>(n.id)];
          std::vector<int32_t> row(static_cast<size_t>(output_row_words(kind, kk)));
          for (int64_t r = 0; r < rows; ++r) {
            encode_output_row(kind, std::span<const float>(x + r * k, static_cast<size_t>(k)), kk, row.data());
            iv.insert(iv.end(), row.begin(), row.end());
          }
          break;
        }
        case Op::fused_matmul:  // made by the compiler's fuse pass; the oracle runs unfused graphs
          fail("reference backend: %{} is a fused_matmul; run the graph before the fuse pass", n.id);
      }
      ptr[static_cast<size_t>(n.id)] = out.data();
      len[static_cast<size_t>(n.id)] = out.size();
      // Free inputs nobody reads later: peak memory stays at a few activations.
      for (int i : n.inputs)
        if (last_use_[static_cast<size_t>(i)] == n.id && !is_output(i)) std::vector<float>().swap(val[static_cast<size_t>(i)]);
    }
    MK_CHECK(!g_.outputs.empty());
    int_outputs_.clear();
    for (const auto& o : g_.outputs)
      int_outputs_[o.name] = std::move(ival[static_cast<size_t>(o.value)]);
    return val[static_cast<size_t>(g_.outputs[0].value)];
  }

  const std::vector<float>& weight_f32_ref(const Node& n) {
    auto it = wcache_.find(n.id);
    if (it != wcache_.end()) return it->second;
    const WeightTensor& t = m_.get(n.weight);
    std::vector<float> f(static_cast<size_t>(t.numel()));
    to_f32(t.dtype, t.data, f.data(), t.numel());
    return wcache_.emplace(n.id, std::move(f)).first->second;
  }
  // Non-f32 (or unaligned) weights are converted once and kept.
  const std::vector<float>& weight_f32(const Node& n) { return weight_f32_ref(n); }
  bool is_output(int id) const {
    for (const auto& o : g_.outputs)
      if (o.value == id) return true;
    return false;
  }

  const Graph& g_;
  const ModelFile& m_;
  // The last run's i32 outputs by name: "greedy" (i32 [rows, 4]), "topk" (i32 [rows, 4 + 2k]).
  std::map<std::string, std::vector<int32_t>> int_outputs_;
  int64_t n_ctx_ = 0;
  StepLimits limits_{256};  // rows per step: the compiled backends' default max_tokens
  KvWritten written_;       // the pool rows written so far (prepare_step checks batches against it)
  bool all_rows_ = false;   // the output is logits of every row (all_logits)
  std::unordered_map<int, std::vector<float>> caches_;
  std::unordered_map<int, std::vector<float>> wcache_;
  std::vector<int> last_use_;
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend(const Graph& g, const ModelFile& m, const BackendOptions& o) {
  // The oracle computes in float32/float64 only; llama.cpp's numerics exist on the cpu backend.
  if (o.act_quant == "on") fail("--act-quant on: the reference backend keeps activations in float32 (cpu only)");
  if (o.kv_type == "f16") usage_fail("--kv-type f16: the reference backend keeps the KV cache in float32 (cpu only)");
  // Splits change the order of the softmax sums: an oracle that took them would no longer be one, so
  // any value but 1 (and -1, the default) is refused rather than ignored.
  if (o.attn_splits != -1 && o.attn_splits != 1)
    usage_fail("--attn-splits {}: the reference backend computes attention in one pass (1 split); flash-decoding splits "
         "run on the cpu, cuda and cuda-emu backends",
         o.attn_splits);
  // The schedule distributes the megakernel's instructions over workers; the oracle runs op by op.
  if (o.schedule != "dynamic")
    usage_fail("--schedule {}: the reference backend runs op by op, without a megakernel schedule; schedules apply to the "
         "cpu and CUDA backends",
         o.schedule);
  // The trace is a per-worker timeline of the megakernel's instructions; the oracle has neither.
  if (!o.trace_path.empty())
    usage_fail("--trace: the reference backend has no trace (a timeline of the megakernel's workers); use --backend cpu or cuda");
  return std::make_unique<ReferenceBackend>(g, m);
}

}  // namespace mk
