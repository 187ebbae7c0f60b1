#include "isa/program.h"

#include <fmt/format.h>

#include <array>
#include <map>

#include "support/error.h"

namespace mk {

namespace {
constexpr std::string_view kOpcodeNames[] = {
#define MK_OPCODE(name, summary) #name,
#include "isa/instr.def"
#undef MK_OPCODE
};
constexpr std::string_view kOpcodeSummaries[] = {
#define MK_OPCODE(name, summary) summary,
#include "isa/instr.def"
#undef MK_OPCODE
};

std::string shape2(const SymExpr& rows, int64_t cols) { return fmt::format("[{}, {}]", rows.str(), cols); }
}  // namespace

std::string_view opcode_name(Opcode op) { return kOpcodeNames[static_cast<int>(op)]; }
std::string_view opcode_summary(Opcode op) { return kOpcodeSummaries[static_cast<int>(op)]; }

std::string_view buffer_kind_name(BufferKind k) {
  switch (k) {
    case BufferKind::input: return "input";
    case BufferKind::activation: return "act";
    case BufferKind::kv: return "kv";
  }
  return "?";
}
std::string_view act_name(Act a) {
  switch (a) {
    case Act::none: return "none";
    case Act::silu: return "silu";
    case Act::gelu: return "gelu";
    case Act::gelu_tanh: return "gelu_tanh";
  }
  return "?";
}
std::string_view epi_name(Epi e) {
  switch (e) {
    case Epi::none: return "none";
    case Epi::add: return "add";
    case Epi::rope: return "rope";
    case Epi::store: return "store";
    case Epi::rope_store: return "rope_store";
  }
  return "?";
}
std::string_view schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::dynamic: return "dynamic";
    case ScheduleKind::static_rr: return "static-rr";
    case ScheduleKind::static_cp: return "static-cp";
  }
  return "?";
}
ScheduleKind schedule_from_name(std::string_view name) {
  if (name == "dynamic") return ScheduleKind::dynamic;
  if (name == "static-rr") return ScheduleKind::static_rr;
  if (name == "static-cp") return ScheduleKind::static_cp;
  fail("unknown schedule '{}' (expected dynamic, static-rr or static-cp)", name);
}

std::string Program::op_str(int i) const {
  const OpDesc& o = ops.at(static_cast<size_t>(i));
  std::string s = fmt::format("op{} {} \"{}\" L{} {} k={} tile_cols={}", i, opcode_name(o.opcode), o.name, o.layer,
                              shape2(o.rows, o.cols), o.k, o.tile_cols);
  auto buf = [&](const char* slot, int b) {
    if (b >= 0) s += fmt::format(" {}=b{}", slot, b);
  };
  auto wt = [&](const char* slot, int w) {
    if (w >= 0) s += fmt::format(" {}=w{}", slot, w);
  };
  buf("out", o.out);
  buf("x", o.x);
  buf("y", o.y);
  buf("z", o.z);
  buf("res", o.res);
  buf("pos", o.pos);
  buf("ids", o.ids);
  buf("ss", o.ss);
  buf("ss_out", o.ss_out);
  wt("w", o.w);
  wt("w_up", o.w_up);
  wt("norm_w", o.norm_w);
  wt("bias", o.bias);
  if (o.pro_rms) s += " pro=rms_norm";
  if (o.glu != Act::none) s += fmt::format(" glu={}", act_name(o.glu));
  if (o.epi != Epi::none) s += fmt::format(" epi={}", epi_name(o.epi));
  if (o.pro_rms || o.opcode == Opcode::rms_norm || o.opcode == Opcode::layer_norm)
    s += fmt::format(" eps={} weight_offset={}", o.eps, o.weight_offset);
  if (o.opcode == Opcode::rms_norm) s += fmt::format(" group={}", o.group);
  const bool attn = o.opcode == Opcode::attention || o.opcode == Opcode::attention_partial;
  if (o.opcode == Opcode::scale || attn) s += fmt::format(" scale={}", o.scale);
  if (attn && o.window > 0) s += fmt::format(" window={}", o.window);
  if (o.opcode == Opcode::softcap || (attn && o.softcap > 0)) s += fmt::format(" softcap={}", o.softcap);
  if (attn || o.opcode == Opcode::attention_combine)
    s += fmt::format(" n_head={} n_head_kv={} head_dim={}", o.n_head, o.n_head_kv, o.head_dim);
  if (o.opcode == Opcode::attention_partial || o.opcode == Opcode::attention_combine)
    s += fmt::format(" attn_splits={}", o.attn_splits);
  if (o.opcode == Opcode::moe_route) s += fmt::format(" n_expert={} k={} norm={}", o.n_expert, o.n_expert_used, o.moe_norm ? 1 : 0);
  if (o.opcode == Opcode::moe_matmul)
    s += fmt::format(" n_expert={} k={} {}", o.n_expert, o.n_expert_used, o.moe_reduce ? "reduce" : "expand");
  if (!o.inv_freq.empty())
    s += fmt::format(" rope(head_dim={}, n_rot={}, {}, theta={})", o.head_dim, o.n_rot,
                     o.rope_halves ? "halves" : "adjacent", o.theta);
  return s;
}

std::string Program::instr_str(int i) const {
  const Instr& in = instrs.at(static_cast<size_t>(i));
  std::string w;
  for (const Wait& x : in.waits) w += fmt::format("{}c{}:{}", w.empty() ? "" : " ", x.counter, x.count);
  const std::string rows = in.row_parts > 1 ? fmt::format(" rows {}/{}", in.row_part, in.row_parts) : "";
  return fmt::format("{} {} L{} op{} t{} [{}:{}){} wait {{{}}} signal c{}", i, opcode_name(in.opcode), in.layer, in.op,
                     in.tile, in.c0, in.c1, rows, w, in.signal);
}

std::string Program::summary() const {
  std::array<int, kNumOpcodes> per{};
  size_t n_waits = 0;
  for (const Instr& in : instrs) {
    per[static_cast<size_t>(in.opcode)]++;
    n_waits += in.waits.size();
  }
  std::string s = fmt::format("summary: {} instructions per step, {} ops, {} counters, {} waits\n", instrs.size(),
                              ops.size(), counters.size(), n_waits);
  for (int o = 0; o < kNumOpcodes; ++o)
    if (per[static_cast<size_t>(o)]) s += fmt::format("  {:<12} {}\n", opcode_name(static_cast<Opcode>(o)), per[static_cast<size_t>(o)]);
  s += fmt::format("  arena {} bytes, kv cache {} bytes, workers {}, schedule {}, max_tokens {}\n", arena_bytes,
                   kv_bytes, workers, schedule_name(schedule), max_tokens);
  return s;
}

std::string Program::listing() const {
  std::string s;
  for (int i = 0; i < static_cast<int>(instrs.size()); ++i) {
    const Instr& in = instrs[static_cast<size_t>(i)];
    s += instr_str(i) + "  # " + ops[static_cast<size_t>(in.op)].name + "\n";
  }
  return s + summary();
}

std::string Program::str() const {
  std::string s = fmt::format("program workers={} max_tokens={} n_ctx={} kv_block={} kv_pool={} schedule={}\n", workers,
                              max_tokens, n_ctx, kv_block_size, kv_pool_rows, schedule_name(schedule));
  s += fmt::format("weights ({})\n", weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    std::string sh = "[";
    for (size_t d = 0; d < weights[i].shape.size(); ++d) sh += (d ? ", " : "") + std::to_string(weights[i].shape[d]);
    s += fmt::format("  w{} @{} {}{}]\n", i, weights[i].name, dtype_name(weights[i].dtype), sh);
  }
  s += fmt::format("buffers ({})\n", buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    s += fmt::format("  b{} {} \"{}\" {}{} max_rows={} offset={} bytes={}{}\n", i, buffer_kind_name(b.kind), b.name,
                     dtype_name(b.dtype), shape2(b.rows, b.cols), b.max_rows, b.offset, b.bytes(),
                     b.is_output ? " output" : "");
  }
  s += fmt::format("ops ({})\n", ops.size());
  for (size_t i = 0; i < ops.size(); ++i) s += "  " + op_str(static_cast<int>(i)) + "\n";
  s += fmt::format("counters ({})\n", counters.size());
  for (size_t i = 0; i < counters.size(); ++i)
    s += fmt::format("  c{} \"{}\" signals={}\n", i, counters[i].name, counters[i].signals_per_step);
  s += fmt::format("instrs ({})\n", instrs.size());
  for (size_t i = 0; i < instrs.size(); ++i) s += "  " + instr_str(static_cast<int>(i)) + "\n";
  for (size_t w = 0; w < lists.size(); ++w) {
    s += fmt::format("list w{} ({}):", w, lists[w].size());
    for (int32_t i : lists[w]) s += fmt::format(" {}", i);
    s += "\n";
  }
  for (const auto& [name, b] : outputs) s += fmt::format("output \"{}\" b{}\n", name, b);
  s += fmt::format("arena_bytes={} kv_bytes={}\n", arena_bytes, kv_bytes);
  return s;
}

bool sym_provably_le(const SymExpr& a, const SymExpr& b) {
  // b - a = c + t*n_tokens + o*n_out >= 0 for all n_tokens >= 1, 1 <= n_out <= n_tokens: the
  // minimum over n_out is at n_out = 1 (o >= 0) or n_out = n_tokens (o < 0); then linear in n_tokens.
  SymExpr d = b + a * -1;
  const int64_t slope = d.n_out >= 0 ? d.n_tokens : d.n_tokens + d.n_out;
  const int64_t at_one = d.c + (d.n_out >= 0 ? d.n_out : 0) + slope;
  return slope >= 0 && at_one >= 0;
}

bool accesses_may_overlap(const Access& a, const Access& b) {
  if (a.c1 <= b.c0 || b.c1 <= a.c0) return false;
  if (sym_provably_le(a.row_hi, b.row_lo) || sym_provably_le(b.row_hi, a.row_lo)) return false;
  // different parts of the same row range (instr_rows): disjoint rows
  if (a.parts > 1 && a.parts == b.parts && a.part != b.part && a.row_lo == b.row_lo && a.row_hi == b.row_hi) return false;
  return true;
}

std::vector<Access> instr_accesses(const Program& p, const Instr& in) {
  const OpDesc& o = p.ops.at(static_cast<size_t>(in.op));
  // At most 6 regions (matmul: x, res, pos, out, ss, ss_out), gathered in a fixed array: a
  // push_back here makes GCC 12 report a false -Wstringop-overflow.
  std::array<Access, 8> a;
  size_t n_a = 0;
  const SymExpr zero = SymExpr::constant(0);
  auto read = [&](int b, SymExpr lo, SymExpr hi, int64_t c0, int64_t c1) {
    if (b >= 0) a.at(n_a++) = {b, false, lo, hi, c0, c1};
  };
  auto write = [&](int b, SymExpr lo, SymExpr hi, int64_t c0, int64_t c1) {
    if (b >= 0) a.at(n_a++) = {b, true, lo, hi, c0, c1};
  };
  auto full_cols = [&](int b) { return p.buffers.at(static_cast<size_t>(b)).cols; };
  const SymExpr R = o.rows;
  // KV pools: a row's K/V goes to its slot and attention reads through block tables, both step
  // inputs, so a store may write and attention may read any pool row: whole-pool regions. Attention
  // then waits for every store tile of its columns, and nothing else touches a pool in a step.
  const SymExpr pool = SymExpr::constant(p.kv_pool_rows);
  switch (o.opcode) {
    case Opcode::embed:
      read(o.ids, zero, R, 0, 1);
      write(o.out, zero, R, in.c0, in.c1);
      break;
    case Opcode::matmul:
      read(o.x, zero, R, 0, o.k);
      read(o.res, zero, R, in.c0, in.c1);
      read(o.pos, zero, R, 0, 1);
      if (o.epi == Epi::store || o.epi == Epi::rope_store)
        write(o.out, zero, pool, in.c0, in.c1);
      else
        write(o.out, zero, R, in.c0, in.c1);
      break;
    case Opcode::attention: {  // rows: part row_part of row_parts of the R rows
      int64_t hpg = o.n_head / o.n_head_kv;
      int64_t g0 = in.c0 / o.head_dim / hpg, g1 = (in.c1 / o.head_dim - 1) / hpg + 1;
      read(o.x, zero, R, in.c0, in.c1);
      a.at(n_a - 1).part = in.row_part, a.at(n_a - 1).parts = in.row_parts;
      read(o.y, zero, pool, g0 * o.head_dim, g1 * o.head_dim);
      read(o.z, zero, pool, g0 * o.head_dim, g1 * o.head_dim);
      write(o.out, zero, R, in.c0, in.c1);
      a.at(n_a - 1).part = in.row_part, a.at(n_a - 1).parts = in.row_parts;
      break;
    }
    case Opcode::attention_partial: {  // one (group, split) tile: columns of scratch [g * S + s] * tile width
      const int64_t hpg = o.n_head / o.n_head_kv, g = in.c0 / attn_partial_tile_cols(o) / o.attn_splits;
      read(o.x, zero, R, g * hpg * o.head_dim, (g + 1) * hpg * o.head_dim);
      read(o.y, zero, pool, g * o.head_dim, (g + 1) * o.head_dim);
      read(o.z, zero, pool, g * o.head_dim, (g + 1) * o.head_dim);
      write(o.out, zero, R, in.c0, in.c1);
      break;
    }
    case Opcode::attention_combine: {  // heads [c0, c1) / head_dim: every split of their groups
      const int64_t hpg = o.n_head / o.n_head_kv;
      const int64_t g0 = in.c0 / o.head_dim / hpg, g1 = (in.c1 / o.head_dim - 1) / hpg + 1;
      const int64_t group_cols = o.attn_splits * hpg * attn_partial_stride(o);
      read(o.x, zero, R, g0 * group_cols, g1 * group_cols);
      write(o.out, zero, R, in.c0, in.c1);
      break;
    }
    case Opcode::rms_norm:
      if (o.group == o.k)
        read(o.x, zero, R, 0, o.k);
      else
        read(o.x, zero, R, in.c0, in.c1);
      write(o.out, zero, R, in.c0, in.c1);
      break;
    case Opcode::layer_norm:
      read(o.x, zero, R, 0, o.k);
      write(o.out, zero, R, in.c0, in.c1);
      break;
    case Opcode::add:
    case Opcode::mul:
      read(o.x, zero, R, in.c0, in.c1);
      read(o.y, zero, R, in.c0, in.c1);
      write(o.out, zero, R, in.c0, in.c1);
      break;
    case Opcode::scale:
    case Opcode::silu:
    case Opcode::gelu:
    case Opcode::gelu_tanh:
    case Opcode::softcap:
      read(o.x, zero, R, in.c0, in.c1);
      write(o.out, zero, R, in.c0, in.c1);
      break;
    case Opcode::rope:
      read(o.x, zero, R, in.c0, in.c1);
      read(o.pos, zero, R, 0, 1);
      write(o.out, zero, R, in.c0, in.c1);
      break;
    case Opcode::kv_store:
      read(o.x, zero, R, in.c0, in.c1);
      write(o.out, zero, pool, in.c0, in.c1);
      break;
    case Opcode::last_row:  // a gather of the rows logit_rows lists: any row of x
      read(o.x, zero, p.buffers.at(static_cast<size_t>(o.x)).rows, in.c0, in.c1);
      write(o.out, zero, R, in.c0, in.c1);
      break;
    case Opcode::moe_matmul:  // all of x's row, the route rows
      read(o.x, zero, R, 0, o.k);
      read(o.y, zero, R, 0, 2 * o.n_expert_used);
      write(o.out, zero, R, in.c0, in.c1);
      break;
    case Opcode::moe_route:
    case Opcode::argmax:  // whole rows of x
    case Opcode::topk:
      read(o.x, zero, R, 0, o.k);
      write(o.out, zero, R, in.c0, in.c1);
      break;
  }
  if (o.ss >= 0) read(o.ss, zero, R, 0, full_cols(o.ss));  // every producer tile's partials
  if (o.ss_out >= 0) write(o.ss_out, zero, R, 2 * static_cast<int64_t>(in.tile), 2 * static_cast<int64_t>(in.tile) + 2);
  return std::vector<Access>(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n_a));
}

}  // namespace mk
