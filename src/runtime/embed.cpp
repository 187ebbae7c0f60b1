#include "runtime/embed.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "support/error.h"
#include "support/json.h"

namespace mk {

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::none: return "none";
    case Pooling::mean: return "mean";
    case Pooling::cls: return "cls";
    case Pooling::last: return "last";
  }
  return "?";
}

Pooling pooling_from_name(std::string_view name) {
  for (Pooling p : {Pooling::none, Pooling::mean, Pooling::cls, Pooling::last})
    if (name == pooling_name(p)) return p;
  fail("pooling: expected none, mean, cls or last, got '{}'", name);
}

Pooling model_pooling(const ModelFile& m) {
  if (m.format == "gguf") {
    const std::string arch = m.has("general.architecture") ? m.get_str("general.architecture") : "";
    const std::string key = arch + ".pooling_type";
    if (arch.empty() || !m.has(key)) return Pooling::mean;
    switch (const int64_t t = m.get_int(key)) {
      case 0: return Pooling::none;
      case 1: return Pooling::mean;
      case 2: return Pooling::cls;
      case 3: return Pooling::last;
      case 4: fail("{}: {} is 4 (rank: a reranker's score), which is not supported; --pooling picks another", m.path, key);
      default: fail("{}: {} is {}, expected 0 (none), 1 (mean), 2 (cls) or 3 (last)", m.path, key, t);
    }
  }
  if (m.format == "hf") {
    // sentence-transformers keeps its pooling beside the model (modules.json's Pooling module).
    const std::string file = (std::filesystem::path(m.path) / "1_Pooling" / "config.json").string();
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) return Pooling::mean;
    const nlohmann::ordered_json c = read_json_file(file);
    if (!c.is_object()) fail("{}: expected a JSON object", file);
    std::vector<Pooling> on;
    for (const auto& [key, p] : {std::pair{"pooling_mode_mean_tokens", Pooling::mean}, {"pooling_mode_cls_token", Pooling::cls},
                                 {"pooling_mode_lasttoken", Pooling::last}}) {
      const auto it = c.find(key);
      if (it == c.end()) continue;
      if (!it->is_boolean()) fail("{}: {} must be true or false", file, key);
      if (it->get<bool>()) on.push_back(p);
    }
    for (const char* key : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens"})
      if (const auto it = c.find(key); it != c.end() && it->is_boolean() && it->get<bool>())
        fail("{}: {} is not supported (mean, cls and last are); --pooling picks one", file, key);
    if (on.size() > 1) fail("{}: more than one pooling mode is on (their vectors would be concatenated); --pooling picks one", file);
    return on.empty() ? Pooling::mean : on[0];
  }
  return Pooling::mean;
}

namespace {

// What one input's rows add up to while its steps run.
struct Pooled {
  std::vector<double> sum;  // mean: the sum of its rows
  std::vector<float> rows;  // none: every row; cls / last: the one row
};

bool wanted(Pooling p, int64_t pos, int64_t len) {
  return p == Pooling::none || p == Pooling::mean || (p == Pooling::cls && pos == 0) || (p == Pooling::last && pos == len - 1);
}

void take_row(Pooling p, std::span<const float> row, Pooled& out) {
  if (p == Pooling::mean) {
    if (out.sum.empty()) out.sum.assign(row.size(), 0.0);
    for (size_t i = 0; i < row.size(); ++i) out.sum[i] += row[i];
  } else {
    out.rows.insert(out.rows.end(), row.begin(), row.end());
  }
}

// The first d values of each n_embd-long row.
void truncate_rows(std::vector<float>& v, int64_t n_embd, int64_t d) {
  size_t out = 0;
  for (size_t at = 0; at < v.size(); at += static_cast<size_t>(n_embd))
    for (int64_t i = 0; i < d; ++i) v[out++] = v[at + static_cast<size_t>(i)];
  v.resize(out);
}

void normalize_rows(std::vector<float>& v, int64_t n_embd) {
  for (size_t at = 0; at < v.size(); at += static_cast<size_t>(n_embd)) {
    double ss = 0;
    for (int64_t i = 0; i < n_embd; ++i) ss += static_cast<double>(v[at + i]) * v[at + i];
    if (ss <= 0) continue;
    const double inv = 1.0 / std::sqrt(ss);
    for (int64_t i = 0; i < n_embd; ++i) v[at + i] = static_cast<float>(v[at + i] * inv);
  }
}

}  // namespace

std::vector<std::vector<float>> embed(Backend& backend, int64_t n_embd, int64_t n_ctx, int64_t n_vocab,
                                      std::span<const std::vector<int32_t>> inputs, const EmbedOptions& o) {
  const bool paged = backend.kv_pool_blocks() > 0;
  const int64_t block = paged ? backend.kv_block_size() : 0, pool_blocks = backend.kv_pool_blocks();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& in = inputs[i];
    const int64_t n = static_cast<int64_t>(in.size());
    if (n == 0) fail("input {}: no tokens to embed", i);
    if (n > n_ctx) fail("input {}: {} tokens are more than the context length {}", i, n, n_ctx);
    if (paged && n > pool_blocks * block) fail("input {}: {} tokens are more than the KV pool's {} rows", i, n, pool_blocks * block);
    for (size_t k = 0; k < in.size(); ++k)
      if (in[k] < 0 || in[k] >= n_vocab) fail("input {}: token {} (at {}) is not an id of the vocabulary [0, {})", i, in[k], k, n_vocab);
  }
  std::vector<Pooled> pooled(inputs.size());
  auto take_rows = [&](size_t i, std::span<const float> out, int64_t first_pos) {  // rows of input i from first_pos on
    const int64_t len = static_cast<int64_t>(inputs[i].size());
    for (int64_t r = 0; r * n_embd < static_cast<int64_t>(out.size()); ++r)
      if (wanted(o.pooling, first_pos + r, len)) take_row(o.pooling, out.subspan(static_cast<size_t>(r * n_embd), static_cast<size_t>(n_embd)), pooled[i]);
  };
  if (!paged) {  // one input at a time, all its rows (the graph returns every row)
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (o.before_step) o.before_step();
      const std::vector<float> out = backend.forward(inputs[i], 0);
      if (static_cast<int64_t>(out.size()) != static_cast<int64_t>(inputs[i].size()) * n_embd)
        fail("internal error: embed: the backend returned {} values for {} rows of {}", out.size(), inputs[i].size(), n_embd);
      take_rows(i, out, 0);
    }
  } else {
    const int64_t max_rows = backend.max_batch_rows();
    size_t next = 0;
    while (next < inputs.size()) {
      // A group: the next inputs whose blocks fit the pool together, each its own run of blocks.
      const size_t g0 = next;
      std::vector<std::vector<int32_t>> tables;
      int64_t used = 0;
      while (next < inputs.size()) {
        const int64_t need = (static_cast<int64_t>(inputs[next].size()) + block - 1) / block;
        if (used + need > pool_blocks) break;
        tables.emplace_back(static_cast<size_t>(need));
        for (int64_t b = 0; b < need; ++b) tables.back()[static_cast<size_t>(b)] = static_cast<int32_t>(used + b);
        used += need;
        ++next;
      }
      // Its rows in order, max_rows a step: a sequence's chunk may end one step and go on the next.
      size_t s = g0;
      int64_t pos = 0;
      while (s < next) {
        StepBatch b;
        struct Part {
          size_t input;
          int64_t first_pos, n_wanted;
        };
        std::vector<Part> parts;
        while (s < next && b.n_rows() < max_rows) {
          const int64_t len = static_cast<int64_t>(inputs[s].size());
          const int64_t take = std::min(len - pos, max_rows - b.n_rows());
          const int32_t seq = static_cast<int32_t>(b.block_tables.size());
          b.block_tables.push_back(tables[s - g0]);
          Part part{s, -1, 0};
          for (int64_t p = pos; p < pos + take; ++p) {
            if (wanted(o.pooling, p, len)) {
              if (part.first_pos < 0) part.first_pos = p;
              ++part.n_wanted;
              b.logit_rows.push_back(static_cast<int32_t>(b.n_rows()));
            }
            b.tokens.push_back(inputs[s][static_cast<size_t>(p)]);
            b.positions.push_back(static_cast<int32_t>(p));
            b.seq.push_back(seq);
          }
          if (part.n_wanted > 0) parts.push_back(part);
          pos += take;
          if (pos == len) ++s, pos = 0;
        }
        if (b.logit_rows.empty()) b.logit_rows.push_back(static_cast<int32_t>(b.n_rows() - 1));  // a row must come back
        if (o.before_step) o.before_step();
        const std::vector<float> out = backend.forward(b);
        if (static_cast<int64_t>(out.size()) != static_cast<int64_t>(b.logit_rows.size()) * n_embd)
          fail("internal error: embed: the backend returned {} values for {} rows of {}", out.size(), b.logit_rows.size(), n_embd);
        int64_t at = 0;  // wanted rows of a part are consecutive positions (none/mean: all; cls/last: one)
        for (const Part& part : parts) {
          take_rows(part.input, std::span<const float>(out).subspan(static_cast<size_t>(at * n_embd), static_cast<size_t>(part.n_wanted * n_embd)),
                    part.first_pos);
          at += part.n_wanted;
        }
      }
    }
  }
  std::vector<std::vector<float>> result(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<float>& v = result[i];
    if (o.pooling == Pooling::mean) {
      v.resize(static_cast<size_t>(n_embd));
      const double n = static_cast<double>(inputs[i].size());
      for (int64_t k = 0; k < n_embd; ++k) v[static_cast<size_t>(k)] = static_cast<float>(pooled[i].sum[static_cast<size_t>(k)] / n);
    } else {
      v = std::move(pooled[i].rows);
    }
    for (size_t k = 0; k < v.size(); ++k)
      if (!std::isfinite(v[k]))
        fail("input {}: its embedding is not finite ({} at row {}, element {}): the model's hidden state overflowed", i,
             v[k], static_cast<int64_t>(k) / n_embd, static_cast<int64_t>(k) % n_embd);
    const int64_t d = o.dimensions > 0 && o.dimensions < n_embd ? o.dimensions : n_embd;
    if (d < n_embd) truncate_rows(v, n_embd, d);
    if (o.normalize) normalize_rows(v, d);
  }
  return result;
}

struct EmbedBatcher::Call {
  std::span<const std::vector<int32_t>> inputs;
  int64_t dimensions = 0;
  bool normalize = true;
  const std::function<void()>* check = nullptr;
  std::vector<std::vector<float>> vectors;
  std::exception_ptr error;
  bool taken = false, done = false;
};

EmbedBatcher::EmbedBatcher(Backend& backend, int64_t n_embd, int64_t n_ctx, int64_t n_vocab, Pooling pooling)
    : backend_(backend), n_embd_(n_embd), n_ctx_(n_ctx), n_vocab_(n_vocab), pooling_(pooling) {
  if (pooling == Pooling::none) fail("EmbedBatcher: pooling none gives a vector per token; batch calls with a pooling");
}

EmbedBatcher::Stats EmbedBatcher::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::vector<std::vector<float>> EmbedBatcher::embed(std::span<const std::vector<int32_t>> inputs, int64_t dimensions,
                                                    bool normalize, const std::function<void()>& check) {
  Call call;
  call.inputs = inputs;
  call.dimensions = dimensions;
  call.normalize = normalize;
  call.check = check ? &check : nullptr;
  std::unique_lock lock(mu_);
  waiting_.push_back(&call);
  while (!call.done) {
    if (!busy_) {  // this thread runs the next batch: every call waiting now
      std::vector<Call*> batch;
      batch.swap(waiting_);
      for (Call* c : batch) c->taken = true;
      busy_ = true;
      ++stats_.batches;
      lock.unlock();
      run(batch, &call, lock);  // returns with the lock held, busy_ false
      cv_.notify_all();
      continue;
    }
    cv_.wait_for(lock, std::chrono::milliseconds(20));
    if (!call.taken && !call.done && call.check) {
      try {
        (*call.check)();
      } catch (...) {  // left while waiting: out of the queue
        std::erase(waiting_, &call);
        throw;
      }
    }
  }
  if (call.error) std::rethrow_exception(call.error);
  return std::move(call.vectors);
}

void EmbedBatcher::run(std::vector<Call*>& batch, Call* own, std::unique_lock<std::mutex>& lock) {
  // Smallest calls first, in parts of about one step's rows: a short request's vectors come back
  // after the first part, not after a long request in the same batch (new-user trial 55: a short
  // request waited for a long one past both deadlines). Once this thread's own call is done, the
  // calls not started go back to the front of the queue for the next thread to run.
  std::stable_sort(batch.begin(), batch.end(), [](const Call* a, const Call* b) {
    auto rows = [](const Call* c) {
      size_t n = 0;
      for (const auto& in : c->inputs) n += in.size();
      return n;
    };
    return rows(a) < rows(b);
  });
  const int64_t part_rows = std::max<int64_t>(backend_.kv_pool_blocks() > 0 ? backend_.max_batch_rows() : 1, 1);
  size_t next = 0;
  while (next < batch.size()) {
    std::vector<Call*> part;
    int64_t rows = 0;
    while (next < batch.size()) {
      int64_t n = 0;
      for (const auto& in : batch[next]->inputs) n += static_cast<int64_t>(in.size());
      if (!part.empty() && rows + n > part_rows) break;
      part.push_back(batch[next++]);
      rows += n;
    }
    run_part(part);
    lock.lock();
    stats_.calls += part.size();
    for (Call* c : part) c->done = true;
    cv_.notify_all();
    if (own->done && next < batch.size()) {  // the rest to another thread
      for (size_t k = next; k < batch.size(); ++k) batch[k]->taken = false;
      waiting_.insert(waiting_.begin(), batch.begin() + static_cast<std::ptrdiff_t>(next), batch.end());
      break;
    }
    if (next < batch.size()) lock.unlock();
  }
  busy_ = false;
}

void EmbedBatcher::run_part(std::vector<Call*>& batch) {
  // The calls' inputs in order, each vector shaped (dimensions, normalization) for its own call.
  std::vector<std::vector<int32_t>> all;
  for (Call* c : batch) all.insert(all.end(), c->inputs.begin(), c->inputs.end());
  EmbedOptions o;
  o.pooling = pooling_;
  o.normalize = false;
  o.before_step = [&] {  // each call's check; the part stops when none is left wanting it
    bool wanted = false;
    for (Call* c : batch) {
      if (!c->error && c->check) {
        try {
          (*c->check)();
        } catch (...) {
          c->error = std::current_exception();
        }
      }
      wanted |= !c->error;
    }
    if (!wanted) throw std::runtime_error("every call of the batch ended");
  };
  auto shape = [&](Call* c, std::vector<std::vector<float>> v) {
    const int64_t d = c->dimensions > 0 && c->dimensions < n_embd_ ? c->dimensions : n_embd_;
    for (auto& x : v) {
      if (d < n_embd_) truncate_rows(x, n_embd_, d);
      if (c->normalize) normalize_rows(x, d);
    }
    c->vectors = std::move(v);
  };
  try {
    std::vector<std::vector<float>> vectors = mk::embed(backend_, n_embd_, n_ctx_, n_vocab_, all, o);
    size_t at = 0;
    for (Call* c : batch) {
      std::vector<std::vector<float>> mine(std::make_move_iterator(vectors.begin() + static_cast<std::ptrdiff_t>(at)),
                                           std::make_move_iterator(vectors.begin() + static_cast<std::ptrdiff_t>(at + c->inputs.size())));
      at += c->inputs.size();
      if (!c->error) shape(c, std::move(mine));
    }
  } catch (const Error&) {  // one call's input: each call alone, with its own indices in its error
    for (Call* c : batch) {
      if (c->error) continue;
      try {
        EmbedOptions one = o;
        one.before_step = [c] {
          if (c->check) (*c->check)();
        };
        shape(c, mk::embed(backend_, n_embd_, n_ctx_, n_vocab_, c->inputs, one));
      } catch (...) {
        c->error = std::current_exception();
      }
    }
  } catch (...) {  // the checks ended every call (their errors are set), or something else failed
    const std::exception_ptr e = std::current_exception();
    for (Call* c : batch)
      if (!c->error) c->error = e;
  }
}

}  // namespace mk
