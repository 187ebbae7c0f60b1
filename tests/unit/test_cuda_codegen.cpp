// CUDA code generation without a GPU: real Programs (stories260K, a synthetic bf16 Llama with GQA)
// become sources that NVRTC compiles for sm_90; any compile error fails the test. Running the
// kernels needs a device: bench/device_check.sh does that.
#include <gtest/gtest.h>

#include <random>

#include "archs/arch.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/nvrtc.h"
#include "model/model_file.h"
#include "passes/pass.h"
#include "support/error.h"

using namespace mk;

namespace {

const std::string kStories = std::string(MK_SHARED_DIR) + "/models/stories260K/stories260K.gguf";

// A Llama-shaped model with random bf16 weights in GGUF names (see archs/blocks.cpp).
ModelFile synthetic_llama_bf16(int64_t n_vocab, int64_t n_embd, int64_t n_layer, int64_t n_head, int64_t n_head_kv,
                               int64_t n_ff, uint32_t seed) {
  ModelFile m;
  m.path = "synthetic-llama-bf16";
  m.format = "gguf";
  m.metadata["general.architecture"] = "llama";
  m.metadata["llama.embedding_length"] = n_embd;
  m.metadata["llama.block_count"] = n_layer;
  m.metadata["llama.attention.head_count"] = n_head;
  m.metadata["llama.attention.head_count_kv"] = n_head_kv;
  m.metadata["llama.feed_forward_length"] = n_ff;
  m.metadata["llama.context_length"] = 256;
  m.metadata["llama.attention.layer_norm_rms_epsilon"] = 1e-5;
  m.metadata["llama.rope.freq_base"] = 500000.0;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float offset = 0.0f) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    auto data = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(n) * 2);
    auto* p = reinterpret_cast<uint16_t*>(data->data());
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(offset + dist(rng));
    WeightTensor t;
    t.name = name;
    t.dtype = DType::BF16;
    t.shape = std::move(shape);
    t.data = data->data();
    t.nbytes = data->size();
    m.owned.push_back(data);
    m.add_tensor(std::move(t));
  };
  const int64_t hd = n_embd / n_head;
  add("token_embd.weight", {n_vocab, n_embd});
  for (int64_t il = 0; il < n_layer; ++il) {
    std::string b = "blk." + std::to_string(il);
    add(b + ".attn_norm.weight", {n_embd}, 1.0f);
    add(b + ".attn_q.weight", {n_head * hd, n_embd});
    add(b + ".attn_k.weight", {n_head_kv * hd, n_embd});
    add(b + ".attn_v.weight", {n_head_kv * hd, n_embd});
    add(b + ".attn_output.weight", {n_embd, n_head * hd});
    add(b + ".ffn_norm.weight", {n_embd}, 1.0f);
    add(b + ".ffn_gate.weight", {n_ff, n_embd});
    add(b + ".ffn_up.weight", {n_ff, n_embd});
    add(b + ".ffn_down.weight", {n_embd, n_ff});
  }
  add("output_norm.weight", {n_embd}, 1.0f);
  add("output.weight", {n_vocab, n_embd});
  return m;
}

Program compile_for_h200(const ModelFile& m, ScheduleKind schedule, int64_t n_ctx) {
  BuildOptions bo;
  bo.n_ctx = n_ctx;
  Graph g = build_graph(m, bo);
  CompileOptions co;
  co.workers = 132;  // one block per SM on an H200
  co.max_tokens = 64;
  co.schedule = schedule;
  return compile_program(g, co);
}

// Generates and compiles; returns the source for further checks.
cuda::CudaSource generate_and_compile(const Program& p, const std::string& name) {
  cuda::CudaSource src = cuda::generate_cuda(p);
  EXPECT_GT(src.n_functions, 0);
  EXPECT_LE(src.n_functions, static_cast<int>(p.ops.size()));
#if MK_HAVE_NVRTC
  cuda::NvrtcOptions o;
  o.arch = "sm_90";
  o.name = name;
  o.use_cache = false;  // CI must really compile
  cuda::NvrtcResult r = cuda::compile_to_cubin(src.code, o);
  EXPECT_GT(r.cubin.size(), 1000u);
  std::printf("[ cuda ] %s: %zu instructions, %zu ops -> %d functions, %zu bytes of shared memory, %zu-byte CUBIN in %.0f ms%s%s\n",
              name.c_str(), p.instrs.size(), p.ops.size(), src.n_functions, src.smem_bytes, r.cubin.size(), r.compile_ms,
              r.log.empty() ? "" : "; log:\n", r.log.c_str());
#endif
  return src;
}

#define MK_REQUIRE_NVRTC()                                              \
  do {                                                                  \
    if (!cuda::nvrtc_version().size()) GTEST_SKIP() << "built without NVRTC"; \
  } while (0)

}  // namespace

TEST(CudaCodegen, Stories260KCompilesForSm90) {
  MK_REQUIRE_NVRTC();
  ModelFile m = load_model(kStories);
  for (ScheduleKind s : {ScheduleKind::dynamic, ScheduleKind::static_cp}) {
    Program p = compile_for_h200(m, s, 256);
    cuda::CudaSource src = generate_and_compile(p, std::string("stories260K-") + std::string(schedule_name(s)) + ".cu");
    EXPECT_NE(src.code.find("mk_megakernel"), std::string::npos);
    EXPECT_NE(src.code.find(s == ScheduleKind::dynamic ? "#define MK_STATIC 0" : "#define MK_STATIC 1"), std::string::npos);
    // One function serves the same projection in every layer (stories260K has 5 layers).
    EXPECT_LT(src.n_functions, static_cast<int>(p.ops.size()));
  }
}

TEST(CudaCodegen, SyntheticBf16LlamaCompilesForSm90) {
  MK_REQUIRE_NVRTC();
  ModelFile m = synthetic_llama_bf16(512, 256, 2, 4, 2, 512, 7);
  Program p = compile_for_h200(m, ScheduleKind::dynamic, 256);
  cuda::CudaSource src = generate_and_compile(p, "synthetic-llama-bf16.cu");
  EXPECT_NE(src.code.find("using W = MkBF16"), std::string::npos);
  EXPECT_NE(src.code.find("HPG = 2"), std::string::npos);  // grouped-query attention baked in
}

TEST(CudaCodegen, DeviceTablesMatchTheProgram) {
  ModelFile m = load_model(kStories);
  Program p = compile_for_h200(m, ScheduleKind::static_cp, 128);
  cuda::CudaSource src = cuda::generate_cuda(p);
  cuda::DeviceTables t = cuda::build_device_tables(p, src);
  ASSERT_EQ(t.instrs.size(), p.instrs.size());
  size_t waits = 0;
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const auto& in = p.instrs[i];
    const auto& d = t.instrs[i];
    EXPECT_EQ(d.op, in.op);
    EXPECT_EQ(d.fn, src.op_function[static_cast<size_t>(in.op)]);
    EXPECT_EQ(d.c0, in.c0);
    EXPECT_EQ(d.c1, in.c1);
    EXPECT_EQ(d.signal, in.signal);
    ASSERT_EQ(d.n_waits, static_cast<int>(in.waits.size()));
    for (int w = 0; w < d.n_waits; ++w) {
      EXPECT_EQ(t.waits[static_cast<size_t>(d.wait_begin + w)].counter, in.waits[static_cast<size_t>(w)].counter);
      EXPECT_EQ(t.waits[static_cast<size_t>(d.wait_begin + w)].count, in.waits[static_cast<size_t>(w)].count);
    }
    waits += in.waits.size();
  }
  EXPECT_EQ(t.waits.size(), waits);
  ASSERT_EQ(t.list_offsets.size(), p.lists.size() + 1);
  EXPECT_EQ(static_cast<size_t>(t.list_offsets.back()), p.instrs.size());
  // Launch order: every op after the ops whose counters it waits on.
  std::vector<int> rank(p.ops.size(), -1);
  for (size_t i = 0; i < t.launch_order.size(); ++i) rank[static_cast<size_t>(t.launch_order[i])] = static_cast<int>(i);
  for (const auto& in : p.instrs) {
    ASSERT_GE(rank[static_cast<size_t>(in.op)], 0);
    for (const auto& w : in.waits)
      for (const auto& prod : p.instrs)
        if (prod.signal == w.counter && prod.op != in.op) EXPECT_LT(rank[static_cast<size_t>(prod.op)], rank[static_cast<size_t>(in.op)]);
  }
}

TEST(CudaCodegen, UnsupportedWeightTypeIsAClearError) {
  ModelFile m = load_model(kStories);
  Program p = compile_for_h200(m, ScheduleKind::dynamic, 64);
  cuda::CudaCodegenOptions o;
  o.weight_dtypes.assign(p.weights.size(), DType::Q8_0);
  try {
    cuda::generate_cuda(p, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
}
