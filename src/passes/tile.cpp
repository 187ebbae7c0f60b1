// Pass "tile": lowers every op of the (fused) graph to an OpDesc and a 1-D grid of instructions,
// each computing a range of output columns for all rows (attention: of a part of the rows).
// Inputs and KV caches become buffers;
// views (kv_store results) alias their cache.
//
// Tile widths are chosen per op from its shape, its weight bytes and the worker count:
//   matmul     about `tile_bytes` of weights per tile, at least workers * tiles_per_worker tiles
//              when the width allows, aligned to 16 columns (to head_dim for rotated-halves RoPE,
//              and where a head is not a multiple of 16 columns; CompileOptions::head_tiles)
//   attention  one KV-head group (the query heads sharing a KV head) per tile, split into single
//              heads when there are fewer groups than workers, and cut into row parts when
//              those tiles do not divide evenly among the workers (attn_row_parts); with attn_splits S > 1
//              (flash-decoding) attention_partial tiles = KV group x split, then attention_combine
//              over whole heads, cheap
//   others     cheap: about one tile per worker, aligned to 16 columns / the op's natural unit
// Per-element arithmetic never depends on the tile bounds, so any tiling gives the same bits.
#include <algorithm>
#include <map>
#include <numeric>

#include "ir/fused.h"
#include "ir/ops.h"
#include "passes/pass.h"
#include "support/error.h"

namespace mk {

namespace {

int layer_of(const std::string& name) {
  // Names follow the glossary: "blk.<il>.<what>".
  if (name.rfind("blk.", 0) != 0) return -1;
  size_t end = name.find('.', 4);
  try {
    return std::stoi(name.substr(4, end - 4));
  } catch (...) {
    return -1;
  }
}

double weight_bytes_per_element(DType t) {
  return static_cast<double>(dtype_block_bytes(t)) / static_cast<double>(dtype_block_size(t));
}

int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

constexpr int64_t kMaxAttnSplits = 64;
constexpr int64_t kMaxAttnRowParts = 1024;  // Instr::row_parts (the CUDA instruction table keeps it in 15 bits)

class Lowering {
 public:
  Lowering(const Graph& g, const CompileOptions& o, Program& p) : g_(g), o_(o), p_(p) {}

  void run() {
    p_.workers = o_.workers;
    p_.max_tokens = o_.max_tokens;
    value_buf_.assign(static_cast<size_t>(g_.size()), -1);
    value_wt_.assign(static_cast<size_t>(g_.size()), -1);
    users_.assign(static_cast<size_t>(g_.size()), {});
    for (const Node& n : g_.nodes)
      for (int i : n.inputs) users_[static_cast<size_t>(i)].push_back(n.id);
    for (const Node& n : g_.nodes) lower(n);
    if (o_.rms_partials) add_rms_partials();
    // Attention reads each row's position even where no op does (a graph without RoPE).
    if (p_.kv_block_size > 0) step_input(&p_.positions_buffer, "inp_positions", SymExpr::tokens(), 1);
    for (const auto& o : g_.outputs) {
      int b = value_buf_.at(static_cast<size_t>(o.value));
      if (b < 0) fail("tile: output {} is not a computed value", o.name);
      p_.buffers[static_cast<size_t>(b)].is_output = true;
      p_.outputs.emplace_back(o.name, b);
    }
  }

 private:
  int buffer(const Node& n, BufferKind kind, DType dt, SymExpr rows, int64_t cols) {
    Buffer b;
    b.name = n.name.empty() ? fmt::format("%{}", n.id) : n.name;
    b.kind = kind;
    b.dtype = dt;
    b.rows = rows;
    b.cols = cols;
    b.max_rows = rows.eval({o_.max_tokens, o_.max_tokens});
    if (kind == BufferKind::kv) b.max_rows = rows.c;
    p_.buffers.push_back(b);
    return static_cast<int>(p_.buffers.size()) - 1;
  }
  int act(const Node& n) { return buffer(n, BufferKind::activation, DType::F32, n.shape[0], n.shape[1].c); }
  // A per-step i32 input the host writes (ragged batch inputs, isa/program.h), made once.
  void step_input(int* id, const std::string& name, SymExpr rows, int64_t cols) {
    if (*id >= 0) return;
    Buffer b;
    b.name = name;
    b.kind = BufferKind::input;
    b.dtype = DType::I32;
    b.rows = rows;
    b.cols = cols;
    b.max_rows = o_.max_tokens;
    p_.buffers.push_back(b);
    *id = static_cast<int>(p_.buffers.size()) - 1;
  }
  // CompileOptions::rms_partials: one partials buffer per x read by pro_rms matmuls whose writer
  // is a single op that stores [rows, c0:c1) per tile (not a KV store), K columns wide.
  void add_rms_partials() {
    std::map<int, int> partials;  // x buffer -> its partials buffer (-1: x's writer cannot make them)
    for (size_t i = 0; i < p_.ops.size(); ++i) {
      OpDesc& c = p_.ops[i];
      if (c.opcode != Opcode::matmul || !c.pro_rms || c.x < 0) continue;
      auto it = partials.find(c.x);
      if (it == partials.end()) it = partials.emplace(c.x, make_partials(c)).first;
      c.ss = it->second;
    }
  }
  int make_partials(const OpDesc& c) {
    const Buffer& xb = p_.buffers[static_cast<size_t>(c.x)];
    if (xb.kind != BufferKind::activation || xb.cols != c.k) return -1;
    int writer = -1;
    for (size_t i = 0; i < p_.ops.size(); ++i)
      if (p_.ops[i].out == c.x) {
        if (writer >= 0) return -1;
        writer = static_cast<int>(i);
      }
    if (writer < 0) return -1;
    OpDesc& w = p_.ops[static_cast<size_t>(writer)];
    const bool stores_rows = w.opcode != Opcode::kv_store && w.opcode != Opcode::attention_partial &&
                             w.opcode != Opcode::argmax && w.epi != Epi::store && w.epi != Epi::rope_store;
    if (!stores_rows || w.cols != c.k || w.ss_out >= 0 || !(w.rows == xb.rows)) return -1;
    int64_t tiles = 0;
    for (const Instr& in : p_.instrs) tiles += in.op == writer;
    Buffer b;
    b.name = xb.name + ".ss";
    b.kind = BufferKind::activation;
    b.dtype = DType::F32;
    b.rows = xb.rows;
    b.max_rows = xb.max_rows;
    b.cols = 2 * tiles;
    p_.buffers.push_back(b);
    w.ss_out = static_cast<int>(p_.buffers.size()) - 1;
    return w.ss_out;
  }
  int buf(int value) const {
    int b = value_buf_.at(static_cast<size_t>(value));
    MK_CHECK(b >= 0, "value %{} has no buffer", value);
    return b;
  }
  int wt(int value) const {
    int w = value_wt_.at(static_cast<size_t>(value));
    MK_CHECK(w >= 0, "value %{} is not a weight", value);
    return w;
  }
  bool read_by_attention(int value, int64_t* head_dim) const {
    for (int u : users_[static_cast<size_t>(value)])
      if (g_[u].op == Op::attention) {
        *head_dim = g_[u].attr_int("head_dim");
        return true;
      }
    return false;
  }

  OpDesc desc(const Node& n, Opcode opc) const {
    OpDesc d;
    d.opcode = opc;
    d.name = n.name.empty() ? fmt::format("%{}", n.id) : n.name;
    d.layer = layer_of(n.name);
    d.node = n.id;
    d.rows = n.shape.at(0);
    d.cols = n.shape.at(1).c;
    return d;
  }

  // Tiles of width `tc` (the last may be narrower) over d.cols.
  // The op's tiles: columns [c0, c0 + tc) for every c0, for each of `row_parts` parts of the rows
  // (part-major: every column tile of part 0, then of part 1, ...).
  // With `segment` > 0 no tile crosses a multiple of it (a moe_matmul's expert slots).
  void emit(OpDesc d, int64_t tc, int64_t row_parts = 1, int64_t segment = 0) {
    tc = std::clamp<int64_t>(tc, 1, d.cols);
    d.tile_cols = tc;
    int op = static_cast<int>(p_.ops.size());
    p_.ops.push_back(d);
    int t = 0;
    for (int64_t part = 0; part < row_parts; ++part)
      for (int64_t c0 = 0, c1 = 0; c0 < d.cols; c0 = c1, ++t) {
        c1 = std::min(d.cols, c0 + tc);
        if (segment > 0) c1 = std::min(c1, (c0 / segment + 1) * segment);
        Instr in;
        in.opcode = d.opcode;
        in.op = op;
        in.layer = d.layer;
        in.tile = t;
        in.c0 = c0;
        in.c1 = c1;
        in.row_part = static_cast<int32_t>(part);
        in.row_parts = static_cast<int32_t>(row_parts);
        p_.instrs.push_back(in);
      }
  }

  // Row parts of attention's `tiles` column tiles (CompileOptions::attn_row_parts).
  int64_t attn_row_parts(int64_t tiles) const {
    const int64_t w = o_.workers, asked = o_.attn_row_parts;
    if (asked < 0 || asked > kMaxAttnRowParts) fail("tile: attn_row_parts must be 0 (auto) to {}, got {}", kMaxAttnRowParts, asked);
    if (asked > 0) return asked;
    // share of the workers' time busy when every tile takes as long: tiles / (workers x rounds)
    const auto busy = [&](int64_t n) { return static_cast<double>(n) / static_cast<double>(w * ((n + w - 1) / w)); };
    if (tiles >= 4 * w || busy(tiles) >= 0.9) return 1;
    for (int64_t parts = 2; parts <= std::min<int64_t>(8, o_.max_tokens); ++parts)
      if (busy(tiles * parts) >= 0.9) return parts;
    return 1;
  }

  // Width for cheap ops: about one tile per worker, a multiple of `align`.
  int64_t cheap_width(int64_t cols, int64_t align) const {
    int64_t a = std::min(cols, align);
    return std::max(a, round_up((cols + o_.workers - 1) / o_.workers, a));
  }

  void set_rope(OpDesc& d, const Node& n) {
    d.head_dim = n.attr_int("head_dim");
    d.n_rot = n.attr_int("n_rot", d.head_dim);
    d.rope_halves = n.attr_str("mode") == "halves";
    d.theta = n.attr_float("theta");
    d.inv_freq = rope_inv_freq(n);
  }

  void lower_matmul(const Node& n) {
    OpDesc d = desc(n, Opcode::matmul);
    FusedMatmulLayout L;
    if (n.op == Op::fused_matmul) L = fused_matmul_layout(n);
    auto in = [&](int slot) { return n.inputs.at(static_cast<size_t>(slot)); };
    const Node& x = g_[in(L.x)];
    d.rows = x.shape[0];
    d.cols = g_[in(L.w)].shape[0].c;
    d.k = x.shape[1].c;
    d.x = buf(in(L.x));
    d.w = wt(in(L.w));
    if (L.w_up >= 0) d.w_up = wt(in(L.w_up));
    d.glu = L.glu == "silu" ? Act::silu : L.glu == "gelu" ? Act::gelu : L.glu == "gelu_tanh" ? Act::gelu_tanh : Act::none;
    if (L.norm_w >= 0) {
      d.pro_rms = true;
      d.norm_w = wt(in(L.norm_w));
      d.eps = n.attr_float("eps");
      d.weight_offset = n.attr_float("weight_offset", 0.0);
    }
    d.epi = L.epi == "add" ? Epi::add : L.epi == "rope" ? Epi::rope : L.epi == "store" ? Epi::store
            : L.epi == "rope_store" ? Epi::rope_store : Epi::none;
    if (L.residual >= 0) d.res = buf(in(L.residual));
    if (L.has_rope()) {
      d.pos = buf(in(L.positions));
      set_rope(d, n);
    }
    if (L.has_store()) {
      d.out = buf(in(L.cache));
      value_buf_[static_cast<size_t>(n.id)] = d.out;  // the value is a view of the cache
    } else {
      d.out = act(n);
      value_buf_[static_cast<size_t>(n.id)] = d.out;
    }
    // Alignment: 16 columns; whole heads for rotated-halves RoPE (a pair spans the head), and for
    // values attention reads when a head is not a whole number of 16-column units (so that no tile
    // straddles two heads); everything in whole heads with CompileOptions::head_tiles.
    int64_t align = 16, hd = 0;
    if (L.has_rope() && (d.rope_halves || o_.head_tiles || d.head_dim % align)) align = d.head_dim;
    if (read_by_attention(n.id, &hd) && (o_.head_tiles || hd % align)) align = std::lcm(align, hd);
    align = std::min(align, d.cols);
    double per_col = static_cast<double>(d.k) * weight_bytes_per_element(p_.weights[static_cast<size_t>(d.w)].dtype) *
                     (d.w_up >= 0 ? 2 : 1);
    int64_t by_bytes = static_cast<int64_t>(static_cast<double>(o_.tile_bytes) / std::max(per_col, 1.0));
    int64_t tc = std::max(align, by_bytes / align * align);
    int64_t want_tiles = static_cast<int64_t>(o_.workers) * o_.tiles_per_worker;
    int64_t for_parallelism = std::max(align, round_up((d.cols + want_tiles - 1) / want_tiles, align));
    tc = std::min(tc, for_parallelism);
    if (o_.max_matmul_cols) {  // the backend's cap (shared memory); below one alignment unit the backend refuses the op
      const int64_t cap = o_.max_matmul_cols(p_.weights[static_cast<size_t>(d.w)].dtype, d.k) / align * align;
      if (cap >= align) tc = std::min(tc, cap);
    }
    emit(d, tc);
  }

  // Tiles as a matmul's over one expert's n rows (about tile_bytes of weights, enough tiles for the
  // workers); expand: the k slots' columns side by side, no tile across two slots.
  void lower_moe_matmul(const Node& n) {
    OpDesc d = desc(n, Opcode::moe_matmul);
    const Node& wn = g_[n.inputs[1]];
    d.x = buf(n.inputs[0]);
    d.w = wt(n.inputs[1]);
    d.y = buf(n.inputs[2]);
    d.k = g_[n.inputs[0]].shape[1].c;
    d.n_expert = wn.shape[0].c;
    d.w_rows = wn.shape[1].c;
    d.n_expert_used = g_[n.inputs[2]].shape[1].c / 2;
    d.moe_reduce = n.attr_int("reduce", 0) != 0;
    if (n.inputs.size() > 3) {
      d.w_up = wt(n.inputs[3]);
      const std::string glu = n.attr_str("glu");
      d.glu = glu == "silu" ? Act::silu : glu == "gelu" ? Act::gelu : Act::gelu_tanh;
    }
    d.out = act(n);
    value_buf_[static_cast<size_t>(n.id)] = d.out;
    const int64_t K = wn.shape[2].c, nw = d.w_rows;
    const int64_t align = std::min<int64_t>(16, nw);
    const double per_col = static_cast<double>(K) * weight_bytes_per_element(wn.dtype) * (d.w_up >= 0 ? 2 : 1);
    const int64_t by_bytes = static_cast<int64_t>(static_cast<double>(o_.tile_bytes) / std::max(per_col, 1.0));
    const int64_t want_tiles = static_cast<int64_t>(o_.workers) * o_.tiles_per_worker;
    const int64_t slots = d.moe_reduce ? 1 : d.n_expert_used;
    int64_t tc = std::max(align, by_bytes / align * align);
    tc = std::min(tc, std::max(align, round_up((nw * slots + want_tiles - 1) / want_tiles, align)));
    if (o_.max_matmul_cols) {
      const int64_t cap = o_.max_matmul_cols(wn.dtype, K) / align * align;
      if (cap >= align) tc = std::min(tc, cap);
    }
    emit(d, std::min(tc, nw), 1, nw);
  }

  // Flash-decoding splits of attention (CompileOptions::attn_splits): 0 = enough that
  // n_head_kv * S tiles cover the workers; never more than the context has positions.
  int64_t attn_splits(const OpDesc& d) const {
    int64_t s = o_.attn_splits;
    if (s < 0) fail("tile: attn_splits must be >= 0 (0 = auto), got {}", s);
    if (s == 0) s = (o_.workers + d.n_head_kv - 1) / d.n_head_kv;
    return std::clamp<int64_t>(s, 1, std::max<int64_t>(1, std::min<int64_t>(kMaxAttnSplits, p_.n_ctx)));
  }

  // attention as attention_partial (one tile per KV group x split, into a scratch activation) and
  // attention_combine (whole heads, cheap); `d` is the attention's OpDesc.
  void lower_split_attention(const Node& n, OpDesc d, int64_t splits) {
    const int64_t hpg = d.n_head / d.n_head_kv;
    OpDesc part = d;
    part.opcode = Opcode::attention_partial;
    part.name = d.name + ".partial";
    part.attn_splits = splits;
    const int64_t tile = hpg * (d.head_dim + 2);
    part.cols = d.n_head_kv * splits * tile;
    part.out = buffer(n, BufferKind::activation, DType::F32, n.shape[0], part.cols);
    p_.buffers.back().name = part.name;
    emit(part, tile);
    OpDesc comb = d;
    comb.opcode = Opcode::attention_combine;
    comb.attn_splits = splits;
    comb.x = part.out;
    comb.y = comb.z = -1;
    emit(comb, cheap_width(d.cols, d.head_dim));
  }

  void lower(const Node& n) {
    auto in = [&](int i) { return n.inputs.at(static_cast<size_t>(i)); };
    switch (n.op) {
      case Op::input: {
        int b = buffer(n, BufferKind::input, DType::I32, SymExpr::tokens(), 1);
        value_buf_[static_cast<size_t>(n.id)] = b;
        (n.attr_str("kind") == "tokens" ? p_.tokens_buffer : p_.positions_buffer) = b;
        return;
      }
      case Op::weight: {
        for (size_t i = 0; i < p_.weights.size(); ++i)
          if (p_.weights[i].name == n.weight) {
            value_wt_[static_cast<size_t>(n.id)] = static_cast<int>(i);
            return;
          }
        ProgramWeight w;
        w.name = n.weight;
        w.dtype = n.dtype;
        for (const auto& s : n.shape) w.shape.push_back(s.c);
        p_.weights.push_back(w);
        value_wt_[static_cast<size_t>(n.id)] = static_cast<int>(p_.weights.size()) - 1;
        return;
      }
      case Op::kv_cache: {
        int b = buffer(n, BufferKind::kv, DType::F32, n.shape[0], n.shape[1].c);
        value_buf_[static_cast<size_t>(n.id)] = b;
        const KvGeometry kv = kv_geometry(n);
        if (p_.kv_block_size > 0 && (kv.n_ctx != p_.n_ctx || kv.block_size != p_.kv_block_size || kv.pool_rows != p_.kv_pool_rows))
          fail("tile: {}: every KV pool must have one geometry (n_ctx, kv_block, kv_pool)", n.name);
        p_.n_ctx = kv.n_ctx;
        p_.kv_block_size = kv.block_size;
        p_.kv_pool_rows = kv.pool_rows;
        step_input(&p_.kv_slot_buffer, "inp_kv_slot", SymExpr::tokens(), 1);
        step_input(&p_.row_seq_buffer, "inp_row_seq", SymExpr::tokens(), 1);
        step_input(&p_.block_table_buffer, "inp_block_table", SymExpr::constant(o_.max_tokens), p_.max_blocks_per_seq());
        return;
      }
      case Op::matmul:
      case Op::fused_matmul:
        lower_matmul(n);
        return;
      case Op::moe_route: {  // one tile: n_expert values per row
        OpDesc d = desc(n, Opcode::moe_route);
        d.x = buf(in(0));
        d.k = d.n_expert = g_[in(0)].shape[1].c;
        d.n_expert_used = d.cols / 2;
        d.moe_norm = n.attr_int("norm", 1) != 0;
        d.out = act(n);
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        emit(d, d.cols);
        return;
      }
      case Op::moe_matmul:
        lower_moe_matmul(n);
        return;
      case Op::embed: {
        OpDesc d = desc(n, Opcode::embed);
        d.w = wt(in(0));
        d.ids = buf(in(1));
        d.k = d.cols;
        d.out = act(n);
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        emit(d, cheap_width(d.cols, 16));
        return;
      }
      case Op::attention: {
        OpDesc d = desc(n, Opcode::attention);
        d.x = buf(in(0));
        d.y = buf(in(1));
        d.z = buf(in(2));
        d.n_head = n.attr_int("n_head");
        d.n_head_kv = n.attr_int("n_head_kv");
        d.head_dim = n.attr_int("head_dim");
        d.scale = n.attr_float("scale");
        d.window = n.attr_int("window", 0);
        d.softcap = n.attr_float("softcap", 0.0);
        d.k = d.head_dim;
        d.out = act(n);
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        const int64_t splits = attn_splits(d);
        if (splits > 1) {
          lower_split_attention(n, d, splits);
          return;
        }
        int64_t heads = d.n_head / d.n_head_kv;
        while (heads > 1 && heads % 2 == 0 && d.n_head / heads < o_.workers) heads /= 2;
        emit(d, heads * d.head_dim, attn_row_parts(d.n_head / heads));
        return;
      }
      case Op::rms_norm:
      case Op::layer_norm: {
        OpDesc d = desc(n, n.op == Op::rms_norm ? Opcode::rms_norm : Opcode::layer_norm);
        d.x = buf(in(0));
        d.k = d.cols;
        d.eps = n.attr_float("eps");
        d.weight_offset = n.attr_float("weight_offset", 0.0);
        d.group = n.op == Op::rms_norm ? n.attr_int("group", d.cols) : d.cols;
        if (n.inputs.size() > 1) d.norm_w = wt(in(1));
        if (n.inputs.size() > 2) d.bias = wt(in(2));
        d.out = act(n);
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        int64_t align = d.group < d.cols ? d.group : 16;
        emit(d, cheap_width(d.cols, align));
        return;
      }
      case Op::add:
      case Op::mul: {
        OpDesc d = desc(n, n.op == Op::add ? Opcode::add : Opcode::mul);
        d.x = buf(in(0));
        if (g_[in(1)].op == Op::weight)
          d.bias = wt(in(1));
        else
          d.y = buf(in(1));
        d.k = d.cols;
        d.out = act(n);
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        emit(d, cheap_width(d.cols, 16));
        return;
      }
      case Op::scale:
      case Op::silu:
      case Op::gelu:
      case Op::gelu_tanh:
      case Op::softcap: {
        Opcode opc = n.op == Op::scale ? Opcode::scale : n.op == Op::silu ? Opcode::silu
                     : n.op == Op::gelu ? Opcode::gelu : n.op == Op::gelu_tanh ? Opcode::gelu_tanh : Opcode::softcap;
        OpDesc d = desc(n, opc);
        d.x = buf(in(0));
        d.k = d.cols;
        if (n.op == Op::scale) d.scale = n.attr_float("s");
        if (n.op == Op::softcap) d.softcap = n.attr_float("cap");
        d.out = act(n);
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        emit(d, cheap_width(d.cols, 16));
        return;
      }
      case Op::rope: {
        OpDesc d = desc(n, Opcode::rope);
        d.x = buf(in(0));
        d.pos = buf(in(1));
        d.k = d.cols;
        set_rope(d, n);
        d.out = act(n);
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        emit(d, cheap_width(d.cols, d.head_dim));
        return;
      }
      case Op::kv_store: {
        OpDesc d = desc(n, Opcode::kv_store);
        d.rows = g_[in(0)].shape[0];
        d.x = buf(in(0));
        d.out = buf(in(1));
        d.k = d.cols;
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        int64_t hd = 16;
        read_by_attention(n.id, &hd);
        emit(d, cheap_width(d.cols, hd));
        return;
      }
      case Op::last_row: {
        OpDesc d = desc(n, Opcode::last_row);
        step_input(&p_.logit_rows_buffer, "inp_logit_rows", SymExpr::out(), 1);
        d.x = buf(in(0));
        d.k = d.cols;
        d.out = act(n);
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        emit(d, cheap_width(d.cols, 16));
        return;
      }
      case Op::argmax: {  // one tile: each row's reduction runs in one worker
        OpDesc d = desc(n, Opcode::argmax);
        d.x = buf(in(0));
        d.k = g_[in(0)].shape[1].c;
        d.out = buffer(n, BufferKind::activation, DType::I32, n.shape[0], 4);
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        emit(d, d.cols);
        return;
      }
      case Op::topk: {  // one tile, as argmax; the candidate count is (cols - 4) / 2
        OpDesc d = desc(n, Opcode::topk);
        d.x = buf(in(0));
        d.k = g_[in(0)].shape[1].c;
        d.out = buffer(n, BufferKind::activation, DType::I32, n.shape[0], n.shape[1].c);
        value_buf_[static_cast<size_t>(n.id)] = d.out;
        emit(d, d.cols);
        return;
      }
    }
    fail("tile: op {} has no lowering", op_name(n.op));
  }

  const Graph& g_;
  const CompileOptions& o_;
  Program& p_;
  std::vector<int> value_buf_, value_wt_;
  std::vector<std::vector<int>> users_;
};

}  // namespace

void run_tile(PassContext& cx) {
  cx.program = Program{};
  Lowering(cx.graph, cx.options, cx.program).run();
  cx.lowered = true;
}

}  // namespace mk
