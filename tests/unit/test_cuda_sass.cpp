// The machine code of the generated megakernel, read without a GPU: NVRTC compiles the source for
// sm_90 and `cuobjdump -sass` disassembles the cubin. Decode is memory-bound, so the matmul paths
// (one row, and several staged rows for prefill) must keep several 16-byte weight loads in flight per lane (issue 8: >= 4, about 25-35 KB per
// SM to stream HBM): the weight loads (`ld.global.nc.L1::no_allocate.v4`, SASS
// `LDG.E.NA.128.CONSTANT`, used only for weights) must come in runs of >= 4 issued back to back,
// i.e. with no instruction in between that reads a register one of them loads and no branch or
// barrier. Skipped (with the reason) where NVRTC, cuobjdump or the nvdisasm it runs is missing;
// both are looked up in $MK_CUOBJDUMP / $MK_NVDISASM, /usr/local/cuda/bin, PATH and
// ~/.cache/megakernel/tools/bin (scripts/setup.sh puts NVIDIA's PyPI wheels there).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "archs/arch.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/nvrtc.h"
#include "model/synth.h"
#include "passes/pass.h"
#include "support/cli.h"

namespace mk {
namespace {

namespace fs = std::filesystem;

// A CUDA tool (`cuobjdump`, or the `nvdisasm` that `cuobjdump -sass` runs) in $MK_<NAME>,
// /usr/local/cuda/bin, PATH or ~/.cache/megakernel/tools/bin (where scripts/setup.sh puts the PyPI
// wheels' copies); "" when none is executable.
std::string find_cuda_tool(const std::string& name) {
  std::vector<std::string> at;
  std::string env = "MK_";
  for (char c : name) env += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (const char* e = std::getenv(env.c_str())) at.push_back(e);
  at.push_back("/usr/local/cuda/bin/" + name);
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    for (std::string dir; std::getline(ss, dir, ':');)
      if (!dir.empty()) at.push_back(dir + "/" + name);
  }
  if (const char* home = std::getenv("HOME")) at.push_back(std::string(home) + "/.cache/megakernel/tools/bin/" + name);
  for (const auto& p : at)
    if (!p.empty() && ::access(p.c_str(), X_OK) == 0) return p;
  return "";
}
std::string find_cuobjdump() { return find_cuda_tool("cuobjdump"); }

std::string run(const std::string& cmd, int* status) { return test::run_shell(cmd, status); }

struct Sass {
  uint64_t addr = 0;
  std::string opcode;                 // without the predicate, e.g. "LDG.E.NA.128.CONSTANT"
  std::vector<std::string> operands;  // as printed, split at commas
};

// The instruction lines of `cuobjdump -sass`: "/*01a0*/  @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;".
std::vector<Sass> parse_sass(const std::string& text) {
  static const std::regex line(R"(^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)\s*([^;]*);)");
  std::vector<Sass> r;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) {
    std::smatch m;
    if (!std::regex_search(l, m, line)) continue;
    Sass s;
    s.addr = std::stoull(m[1].str(), nullptr, 16);
    s.opcode = m[3].str();
    std::stringstream ops(m[4].str());
    for (std::string o; std::getline(ops, o, ',');) s.operands.push_back(o);
    r.push_back(std::move(s));
  }
  return r;
}

std::set<int> registers(const std::string& operand) {
  static const std::regex reg(R"(\bR([0-9]+)(\.64)?\b)");
  std::set<int> r;
  for (std::sregex_iterator it(operand.begin(), operand.end(), reg), end; it != end; ++it) {
    const int n = std::stoi((*it)[1].str());
    r.insert(n);
    if ((*it)[2].matched) r.insert(n + 1);
  }
  return r;
}

bool starts_with_any(const std::string& s, std::initializer_list<const char*> prefixes) {
  for (const char* p : prefixes)
    if (s.rfind(p, 0) == 0) return true;
  return false;
}

// Registers an instruction reads: every operand but the first (the destination), all of them for
// instructions without a register destination (stores, reductions, branches).
std::set<int> reads(const Sass& s) {
  std::set<int> r;
  const bool no_dest = starts_with_any(s.opcode, {"ST", "RED", "BRA", "BRX", "JMP", "CALL", "RET", "EXIT", "BAR", "BSSY",
                                                  "BSYNC", "WARPSYNC", "MEMBAR", "CCTL", "ERRBAR", "NOP"});
  for (size_t i = no_dest ? 0 : 1; i < s.operands.size(); ++i)
    for (int x : registers(s.operands[i])) r.insert(x);
  return r;
}

constexpr const char* kWeightLoad = "LDG.E.NA.128.CONSTANT";

// Lengths of the runs of weight loads: a run starts at a weight load and takes every later weight
// load until an instruction reads a register a load of the run writes (its 4 destination registers),
// or control flow / a barrier intervenes.
// `load` names the weight load counted (default: the 16-byte one; 8-byte ones write 2 registers).
std::vector<int> weight_load_runs(const std::vector<Sass>& code, std::vector<uint64_t>* starts,
                                  const std::string& load = kWeightLoad) {
  const int regs = load.find(".64.") != std::string::npos ? 2 : 4;
  std::vector<int> runs;
  for (size_t i = 0; i < code.size();) {
    if (code[i].opcode != load) {
      ++i;
      continue;
    }
    std::set<int> pending;
    int n = 0;
    size_t j = i;
    for (; j < code.size(); ++j) {
      const Sass& s = code[j];
      bool stop = false;
      for (int x : reads(s)) stop |= pending.count(x) > 0;
      if (stop || starts_with_any(s.opcode, {"BRA", "BRX", "JMP", "CALL", "RET", "EXIT", "BAR", "WARPSYNC", "BSYNC"})) break;
      if (s.opcode == load && !s.operands.empty()) {
        const std::set<int> d = registers(s.operands[0]);
        if (d.empty()) break;
        for (int k = 0; k < regs; ++k) pending.insert(*d.begin() + k);
        ++n;
      }
    }
    runs.push_back(n);
    starts->push_back(code[i].addr);
    i = std::max(j, i + 1);
  }
  return runs;
}

}  // namespace

// The parser on a hand-written listing: a run of 4 loads, then a use; a run of 2 broken by a branch.
TEST(CudaSass, WeightLoadRunsParserCountsLoadsUntilAUse) {
  const std::string text =
      "        /*0000*/                   LDG.E.NA.128.CONSTANT R4, desc[UR6][R2.64] ;\n"
      "        /*0010*/                   IADD3 R20, P0, R2, 0x10, RZ ;\n"
      "        /*0020*/                   LDG.E.NA.128.CONSTANT R8, desc[UR6][R2.64+0x200] ;\n"
      "        /*0030*/               @P1 LDG.E.NA.128.CONSTANT R12, desc[UR6][R20.64] ;\n"
      "        /*0040*/                   LDS.128 R24, [R30] ;\n"
      "        /*0050*/                   LDG.E.NA.128.CONSTANT R16, desc[UR6][R2.64+0x400] ;\n"
      "        /*0060*/                   FFMA R31, R5, R24, R31 ;\n"
      "        /*0070*/                   LDG.E.NA.128.CONSTANT R4, desc[UR6][R22.64] ;\n"
      "        /*0080*/                   LDG.E.NA.128.CONSTANT R8, desc[UR6][R22.64+0x10] ;\n"
      "        /*0090*/              @!P0 BRA 0x200 ;\n"
      "        /*00a0*/                   LDG.E.NA.128.CONSTANT R12, desc[UR6][R22.64+0x20] ;\n";
  const auto code = parse_sass(text);
  ASSERT_EQ(code.size(), 11u);
  EXPECT_EQ(code[3].opcode, kWeightLoad);
  std::vector<uint64_t> starts;
  EXPECT_EQ(weight_load_runs(code, &starts), (std::vector<int>{4, 2, 1}));
  EXPECT_EQ(starts, (std::vector<uint64_t>{0x0, 0x70, 0xa0}));
}

#define MK_REQUIRE_SASS_TOOLS()                                                                                   \
  do {                                                                                                          \
    if (cuda::nvrtc_version().empty()) GTEST_SKIP() << "built without NVRTC";                                   \
    if (find_cuobjdump().empty())                                                                               \
      GTEST_SKIP() << "cuobjdump not found ($MK_CUOBJDUMP, /usr/local/cuda/bin, PATH, ~/.cache/megakernel/tools/bin; " \
                      "scripts/setup.sh installs it)";                                                          \
    if (find_cuda_tool("nvdisasm").empty())                                                                     \
      GTEST_SKIP() << "nvdisasm (run by cuobjdump -sass) not found ($MK_NVDISASM, /usr/local/cuda/bin, PATH, "  \
                      "~/.cache/megakernel/tools/bin; scripts/setup.sh installs it)";                           \
  } while (0)

// NVRTC (sm_90) + cuobjdump -sass of the megakernel of `m` compiled for `max_tokens` rows per step
// (`dtypes`: the device weight types, empty = the model's); *matmul_functions gets the number of
// matmul device functions.
std::vector<Sass> megakernel_sass(const ModelFile& m, int64_t max_tokens, const std::vector<DType>& dtypes,
                                  int* matmul_functions) {
  const std::string cuobjdump = find_cuobjdump();
  BuildOptions bo;
  bo.n_ctx = 256;
  CompileOptions co;
  co.workers = 132;
  co.max_tokens = max_tokens;
  co.rms_partials = true;  // as the cuda backend compiles it
  Program p = compile_program(build_graph(m, bo), co);
  cuda::CudaCodegenOptions cg;
  cg.perop_kernels = false;
  cg.weight_dtypes = dtypes;
  cuda::CudaSource src = cuda::generate_cuda(p, cg);
  std::set<int> fns;
  for (size_t op = 0; op < p.ops.size(); ++op)
    if (p.ops[op].opcode == Opcode::matmul) fns.insert(src.op_function[op]);
  *matmul_functions = static_cast<int>(fns.size());
  cuda::NvrtcOptions no;
  no.use_cache = false;
  cuda::NvrtcResult r = cuda::compile_to_cubin(src.code, no);
  const fs::path cubin = fs::temp_directory_path() / ("mk_sass_" + std::to_string(::getpid()) + ".cubin");
  std::ofstream(cubin, std::ios::binary).write(r.cubin.data(), static_cast<std::streamsize>(r.cubin.size()));
  int status = 0;
  // cuobjdump finds nvdisasm through NVDISASM_PATH (a directory) or PATH.
  const std::string nvdisasm_dir = fs::path(find_cuda_tool("nvdisasm")).parent_path().string();
  const std::string text =
      run("NVDISASM_PATH='" + nvdisasm_dir + "' " + cuobjdump + " -sass " + cubin.string() + " 2>&1", &status);
  fs::remove(cubin);
  if (const char* dump = std::getenv("MK_SASS_DUMP")) std::ofstream(dump) << text;  // for a look at a failure
  EXPECT_EQ(status, 0) << text.substr(0, 2000);
  const auto code = parse_sass(text);
  EXPECT_GT(code.size(), 1000u) << text.substr(0, 2000);
  return code;
}

// Every run of `load`s in `code` holds >= 4 (at least `min_runs` runs); returns the loads counted.
int expect_runs_of_four(const std::vector<Sass>& code, int min_runs, const std::string& load = kWeightLoad) {
  std::vector<uint64_t> starts;
  const std::vector<int> runs = weight_load_runs(code, &starts, load);
  EXPECT_GE(static_cast<int>(runs.size()), min_runs) << load;
  int loads = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    loads += runs[i];
    EXPECT_GE(runs[i], 4) << load << " at 0x" << std::hex << starts[i] << std::dec << ": only " << runs[i]
                          << " issued before one of them is used";
  }
  ::testing::Test::RecordProperty("weight_load_runs", static_cast<int>(runs.size()));
  ::testing::Test::RecordProperty("weight_loads", loads);
  return loads;
}

// The Llama-3.2-1B shape (2 layers: the device functions depend on shapes only), bf16 weights,
// compiled for `max_tokens` rows per step; every run of weight loads in its SASS must hold >= 4.
void check_weight_load_runs(int64_t max_tokens) {
  SynthSpec spec = synthetic_spec("llama3.2-1b");
  spec.n_layer = 2;
  int matmul_functions = 0;
  const auto code = megakernel_sass(make_synthetic_model(spec, false), max_tokens, {}, &matmul_functions);
  // Every matmul function has its own weight-load loop (q, k, v, attn_output, GLU gate/up, down,
  // classifier: 7 functions), so at least that many runs.
  EXPECT_GE(matmul_functions, 5);
  expect_runs_of_four(code, matmul_functions);
}

// Decode-only (max_tokens 1): every matmul is the RB = 1 path.
TEST(CudaSass, OneRowMatmulIssuesFourWeightLoadsBackToBack) {
  MK_REQUIRE_SASS_TOOLS();
  check_weight_load_runs(1);
}

// Prefill tiles (max_tokens 64: RB = 8 staged rows, and the RB = 1 path for one-row steps). Before
// the step loads were hoisted out of the row-guarded loop, these runs held 1 load (2 with GLU).
TEST(CudaSass, MultiRowMatmulIssuesFourWeightLoadsBackToBack) {
  MK_REQUIRE_SASS_TOOLS();
  check_weight_load_runs(64);
}

// Quantized weights (issue 8): the 1B shape with q4_1 attention/classifier matrices and q4_K FFN
// matrices, decode (max_tokens 1: the memory-bound case; 64 passes too, 3x the NVRTC time). Each
// lane loads a whole unit of blocks (q4_1: 4 blocks = 80 bytes, 5 loads; q4_K: one 144-byte block,
// 9 loads) before dequantizing any of it. Before mk_q_load tied them together, ptxas issued them
// as 3 + 2 (q4_1) and 3 + 2 + 2 + 2 (q4_K).
TEST(CudaSass, QuantizedMatmulIssuesFourWeightLoadsBackToBack) {
  MK_REQUIRE_SASS_TOOLS();
  SynthSpec spec = synthetic_spec("llama3.2-1b");
  spec.n_layer = 2;
  spec.dtype = DType::Q4_1;
  const ModelFile m = make_synthetic_model(spec, false);
  std::vector<DType> dtypes;
  BuildOptions bo;
  bo.n_ctx = 256;
  int matmul_functions = 0;
  {
    CompileOptions co;
    co.workers = 132;
    co.max_tokens = 1;
    const Program p = compile_program(build_graph(m, bo), co);
    for (const ProgramWeight& w : p.weights)
      dtypes.push_back(w.dtype == DType::Q4_1 && w.name.find("ffn_") != std::string::npos ? DType::Q4_K : w.dtype);
    ASSERT_NE(std::count(dtypes.begin(), dtypes.end(), DType::Q4_K), 0);
    ASSERT_NE(std::count(dtypes.begin(), dtypes.end(), DType::Q4_1), 0);
  }
  const auto code = megakernel_sass(m, 1, dtypes, &matmul_functions);
  EXPECT_GE(matmul_functions, 5);
  expect_runs_of_four(code, matmul_functions);
}

// Rows of K % 8 != 0 elements (bf16, ffn_down over n_ff = 772: K % 4 == 0) take 8-byte vector
// weight loads, 4 per lane in flight; before, such rows were read 2 bytes at a time.
TEST(CudaSass, OddKMatmulTakesEightByteWeightLoads) {
  MK_REQUIRE_SASS_TOOLS();
  SynthSpec spec = synthetic_spec("stories15m");
  spec.n_layer = 2;
  spec.n_ff = 772;
  spec.dtype = DType::BF16;
  int matmul_functions = 0;
  const auto code = megakernel_sass(make_synthetic_model(spec, false), 1, {}, &matmul_functions);
  EXPECT_GE(expect_runs_of_four(code, 1, "LDG.E.NA.64.CONSTANT"), 4);
}

}  // namespace mk
