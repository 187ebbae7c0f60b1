// CUDA code generation without a GPU: real Programs (stories260K with a dynamic and a static
// schedule, a synthetic bf16 Llama with GQA, every bf16 Hugging Face fixture family) become sources
// that NVRTC compiles for sm_90 with the cache off; any compile error fails the test. The sources
// are generated first, deduplicated, then compiled in parallel (one NVRTC program per thread), so
// the test costs one compile per distinct source. Running the kernels needs a device:
// bench/device_check.sh does that.
#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <map>
#include <memory>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "archs/arch.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/driver.h"
#include "backend/cuda/nvrtc.h"
#include "model/model_file.h"
#include "model/synth.h"
#include "passes/pass.h"
#include "quant/quant.h"
#include "support/cli.h"
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

// attn_splits 0: what the cuda backends compile (flash-decoding splits covering the 132 SMs).
Program compile_for_h200(const ModelFile& m, ScheduleKind schedule, int64_t n_ctx, int64_t attn_splits = 0,
                         bool embeddings = false) {
  BuildOptions bo;
  bo.n_ctx = n_ctx;
  bo.embeddings = embeddings;
  Graph g = build_graph(m, bo);
  CompileOptions co;
  co.workers = 132;  // one block per SM on an H200
  co.max_tokens = 64;
  co.schedule = schedule;
  co.attn_splits = attn_splits;
  co.rms_partials = true;  // as the cuda backends
  return compile_program(g, co);
}

#define MK_REQUIRE_NVRTC()                                              \
  do {                                                                  \
    if (!cuda::nvrtc_version().size()) GTEST_SKIP() << "built without NVRTC"; \
  } while (0)

// The bf16 Hugging Face fixture families (../shared/fixtures/hf/<family>_bfloat16).
const char* const kHfFamilies[] = {"llama_gqa",    "llama3_scaled_tied", "llama_mha_headdim", "mistral", "qwen2_bias",
                                   "qwen3_qknorm", "gemma",              "phi3",              "gpt2"};

Program compile_hf_for_h200(const std::string& family) {
  const std::string dir = std::string(MK_SHARED_DIR) + "/fixtures/hf/" + family + "_bfloat16";
  ModelFile m = load_model(dir);
  Hparams hp = read_hparams(m);
  BuildOptions bo;
  bo.n_ctx = std::min<int64_t>(hp.n_ctx_train > 0 ? hp.n_ctx_train : 128, 128);
  Graph g = build_graph(m, bo);
  CompileOptions co;
  co.workers = 132;
  co.max_tokens = 32;
  co.attn_splits = 0;  // as the cuda backends
  co.rms_partials = true;
  return compile_program(g, co);
}

struct Case {
  std::string name;
  Program program;
  cuda::CudaSource src;
};

}  // namespace

// Every model the CUDA backend is meant to run generates a source that NVRTC compiles for sm_90:
// all of them to PTX (NVRTC's front end: every template instantiated with the model's constants),
// and the device check's shapes (the 1B and the 8B) on to CUBIN through ptxas, which takes 2-5x
// longer per source (the sources differ in constants, not code paths; the CudaSass tests take
// more through ptxas, quantized ones included).
TEST(CudaCodegen, AllModelsCompileForSm90) {
  MK_REQUIRE_NVRTC();
  std::vector<Case> cases;
  auto add = [&](std::string name, Program p, bool perop_kernels = false, bool trace = false) {
    cuda::CudaCodegenOptions cg;
    cg.perop_kernels = perop_kernels;
    cg.trace = trace;
    cuda::CudaSource src = cuda::generate_cuda(p, cg);
    EXPECT_GT(src.n_functions, 0) << name;
    EXPECT_LE(src.n_functions, static_cast<int>(p.ops.size())) << name;
    EXPECT_EQ(cuda::generate_cuda(p, cg).code, src.code) << name << ": generation is not deterministic";
    EXPECT_EQ(src.code.find("mk_perop_0") != std::string::npos, perop_kernels) << name;
    EXPECT_NE(src.code.find(trace ? "#define MK_TRACE 1" : "#define MK_TRACE 0"), std::string::npos) << name;
    cases.push_back({std::move(name), std::move(p), std::move(src)});
  };
  {
    ModelFile m = load_model(kStories);
    // The dynamic one with the per-op baseline kernels (cuda-perop, cuda-graph), the others as the
    // megakernel alone (what --backend cuda compiles).
    // megakernel alone (what --backend cuda compiles); the static one with tracing (--trace).
    for (ScheduleKind s : {ScheduleKind::dynamic, ScheduleKind::static_cp})
      // (static-cp with one unsplit attention op per KV group: --attn-splits 1.)
      add(std::string("stories260K-") + std::string(schedule_name(s)),
          compile_for_h200(m, s, 256, s == ScheduleKind::dynamic ? 0 : 1), s == ScheduleKind::dynamic,
          s == ScheduleKind::static_cp);
  }
  // An embedding graph (serve --embeddings): the output norm's rows are the program's output.
  add("embeddings-stories260K", compile_for_h200(load_model(kStories), ScheduleKind::dynamic, 256, 0, /*embeddings=*/true));
  add("synthetic-llama-bf16", compile_for_h200(synthetic_llama_bf16(512, 256, 2, 4, 2, 512, 7), ScheduleKind::dynamic, 256));
  // Quantized weights read raw by the device (device/quant.cuh): all ten ggml block types in one
  // 512-wide model (plain matmuls, GLU pairs, a quantized embedding), and stories260K in q4_1
  // (64-wide rows: a unit per column, several columns per warp).
  add("synthetic-llama-all-quant-types",
      compile_for_h200(quant::quantize_model(synthetic_llama_bf16(512, 512, 2, 4, 2, 512, 9),
                                             [](const WeightTensor& w) -> std::optional<DType> {
                                               if (w.shape.size() != 2) return std::nullopt;
                                               const bool l0 = w.name.starts_with("blk.0.");
                                               if (w.name == "token_embd.weight") return DType::Q8_0;
                                               if (w.name == "output.weight") return DType::Q6_K;
                                               if (w.name.ends_with("attn_q.weight")) return l0 ? DType::Q4_0 : DType::Q5_0;
                                               if (w.name.ends_with("attn_k.weight")) return l0 ? DType::Q5_1 : DType::Q2_K;
                                               if (w.name.ends_with("attn_v.weight")) return l0 ? DType::Q3_K : DType::Q4_1;
                                               if (w.name.ends_with("attn_output.weight")) return l0 ? DType::Q4_K : DType::Q5_K;
                                               if (w.name.ends_with("ffn_down.weight")) return l0 ? DType::Q6_K : DType::Q8_0;
                                               return l0 ? DType::Q4_K : DType::Q4_1;  // ffn_gate / ffn_up
                                             }),
                       ScheduleKind::dynamic, 256));
  add("quant-stories260K-q4_1", compile_for_h200(quant::quantize_model(load_model(kStories), DType::Q4_1), ScheduleKind::dynamic, 256));
  // iq4_nl with q5_0, q5_1 and q8_0, as llama.cpp's quantizer mixes them (tests/data/iq4_nl).
  add("iq4_nl-tiny-q3_k_m", compile_for_h200(load_model(std::string(MK_SOURCE_DIR) + "/tests/data/iq4_nl/tiny-q3_k_m.gguf"),
                                             ScheduleKind::dynamic, 64));
  // iq4_xs with q6_K, as llama.cpp's IQ4_XS quantizer wrote them (tests/data/iq4_xs).
  add("iq4_xs-tiny", compile_for_h200(load_model(std::string(MK_SOURCE_DIR) + "/tests/data/iq4_xs/tiny-iq4_xs.gguf"),
                                      ScheduleKind::dynamic, 64));
  // Sliding windows (Gemma 3) and soft-capped attention scores and logits (Gemma 2), whole and split attention.
  for (const char* family : {"gemma2", "gemma3"})
    for (const int64_t splits : {1, 3})
      add(fmt::format("{}-tiny-s{}", family, splits),
          compile_for_h200(load_model(fmt::format("{}/tests/data/{}/{}-tiny.f32.gguf", MK_SOURCE_DIR, family, family)),
                           ScheduleKind::dynamic, 64, splits));
  // GPT-2 and Phi-2 (LayerNorm, learned positions, parallel residuals, a classifier bias), SmolLM3
  // (layers without RoPE), Granite (scaled residuals and logits), OLMo 2 (post-norms only, whole-row q/k norms).
  for (const char* family : {"gpt2", "phi2", "smollm3", "granite", "olmo2", "starcoder2", "stablelm"})
    add(fmt::format("{}-tiny", family),
        compile_for_h200(load_model(fmt::format("{}/tests/data/{}/{}-tiny.f32.gguf", MK_SOURCE_DIR, family, family)),
                         ScheduleKind::dynamic, 64));
  // Mixture of experts (router, expand and reduce expert matmuls): f32 and q8_0 experts.
  for (const char* file : {"qwen3moe-tiny.f32.gguf", "mixtral-tiny.f32.gguf", "olmoe-tiny.f32.gguf", "granitemoe-tiny.f32.gguf",
                           "qwen3moe-tiny.q8_0.gguf"})
    add(std::string("moe-") + file,
        compile_for_h200(load_model(fmt::format("{}/tests/data/qwen3moe/{}", MK_SOURCE_DIR, file)), ScheduleKind::dynamic, 64));
  // The benchmark shapes, from tensors without data (no multi-GB allocation), cut to 2 layers: the
  // device functions depend on the shapes, not on the layer count, and the passes take ~30 s on
  // the full 8B program (56k instructions).
  for (const char* name : {"llama3.2-1b", "llama3.1-8b"}) {
    SynthSpec spec = synthetic_spec(name);
    spec.n_layer = 2;
    add(std::string("synth-") + name + "-2layers", compile_for_h200(make_synthetic_model(spec, false), ScheduleKind::dynamic, 256));
  }
  for (const char* family : kHfFamilies) {
    try {
      add(std::string(family) + "_bfloat16", compile_hf_for_h200(family));
    } catch (const Error& e) {
      ADD_FAILURE() << family << "_bfloat16: " << e.what();
    }
  }

  // Model-specific facts the sources must show.
  for (const Case& c : cases) {
    if (c.name.rfind("stories260K-", 0) == 0) {
      const bool dyn = c.name == "stories260K-dynamic";
      EXPECT_NE(c.src.code.find(dyn ? "#define MK_STATIC 0" : "#define MK_STATIC 1"), std::string::npos) << c.name;
      // One function serves the same projection in every layer (stories260K has 5 layers).
      EXPECT_LT(c.src.n_functions, static_cast<int>(c.program.ops.size())) << c.name;
    }
    if (c.name == "embeddings-stories260K") {
      EXPECT_EQ(c.program.outputs.size(), 1u);
      EXPECT_EQ(c.program.outputs.at(0).first, "embd");
    }
    if (c.name == "synthetic-llama-bf16") {
      EXPECT_NE(c.src.code.find("using W = MkBF16"), std::string::npos);
      EXPECT_NE(c.src.code.find("HPG = 2"), std::string::npos);  // grouped-query attention baked in
    }
    if (c.name == "synthetic-llama-all-quant-types") {
      for (const char* t : {"MkQ4_0", "MkQ4_1", "MkQ5_0", "MkQ5_1", "MkQ8_0", "MkQ2_K", "MkQ3_K", "MkQ4_K", "MkQ5_K", "MkQ6_K"})
        EXPECT_NE(c.src.code.find(std::string("using W = ") + t), std::string::npos) << t;
    }
    if (c.name.find("bfloat16") != std::string::npos) {
      EXPECT_NE(c.src.code.find("using W = MkBF16"), std::string::npos) << c.name;
    }
  }
  std::map<Opcode, int> opcodes;  // opcodes covered across the cases: every one the passes emit
  for (const Case& c : cases)
    for (const OpDesc& o : c.program.ops) opcodes[o.opcode]++;
  std::string covered;
  for (const auto& [o, n] : opcodes) covered += fmt::format(" {}:{}", opcode_name(o), n);
  std::printf("[ cuda ] ops by opcode over all cases:%s\n", covered.c_str());
  for (Opcode o : {Opcode::embed, Opcode::matmul, Opcode::attention, Opcode::attention_partial, Opcode::attention_combine,
                   Opcode::rms_norm, Opcode::layer_norm, Opcode::add, Opcode::scale, Opcode::last_row})
    EXPECT_GT(opcodes[o], 0) << "no case covers " << opcode_name(o);

  // Compile each distinct source once, in parallel.
  std::map<std::string, std::string> distinct;  // code -> first case name
  for (const Case& c : cases) distinct.emplace(c.src.code, c.name);
  std::vector<std::pair<std::string, const std::string*>> jobs;
  for (const auto& [code, name] : distinct) jobs.push_back({name, &code});
  const size_t n_threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  std::vector<std::string> report(jobs.size());
  std::vector<std::string> errors(jobs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      cuda::NvrtcOptions o;
      o.arch = "sm_90";
      o.name = jobs[i].first + ".cu";
      o.use_cache = false;  // CI must really compile
      try {
        const bool cubin = jobs[i].first.rfind("synth-llama3", 0) == 0;  // the device check's shapes
        cuda::NvrtcResult r = cubin ? cuda::compile_to_cubin(*jobs[i].second, o) : cuda::compile_to_ptx(*jobs[i].second, o);
        const size_t bytes = cubin ? r.cubin.size() : r.ptx.size();
        if (bytes < 1000) errors[i] = fmt::format("{}: {} of only {} bytes", jobs[i].first, cubin ? "CUBIN" : "PTX", bytes);
        if (!cubin && r.ptx.find(".entry") == std::string::npos) errors[i] = fmt::format("{}: PTX without a kernel", jobs[i].first);
        report[i] = fmt::format("[ cuda ] {}: {}-byte {} in {:.0f} ms{}{}", jobs[i].first, bytes, cubin ? "CUBIN" : "PTX",
                                r.compile_ms, r.log.empty() ? "" : "; log:\n", r.log);
      } catch (const std::exception& e) {
        errors[i] = fmt::format("{}: {}", jobs[i].first, e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t < std::min(n_threads, jobs.size()); ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  for (const Case& c : cases)
    std::printf("[ cuda ] %s: %zu instructions, %zu ops -> %d functions, %zu bytes of shared memory\n", c.name.c_str(),
                c.program.instrs.size(), c.program.ops.size(), c.src.n_functions, c.src.smem_bytes);
  for (const std::string& r : report)
    if (!r.empty()) std::printf("%s\n", r.c_str());
  for (const std::string& e : errors)
    if (!e.empty()) ADD_FAILURE() << e;
  for (const Case& c : cases)  // families with equal shapes and constants share one source
    if (distinct.at(c.src.code) != c.name) std::printf("[ cuda ] %s: same source as %s\n", c.name.c_str(), distinct.at(c.src.code).c_str());
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
        if (prod.signal == w.counter && prod.op != in.op) {
          EXPECT_LT(rank[static_cast<size_t>(prod.op)], rank[static_cast<size_t>(in.op)]);
        }
  }
}

TEST(CudaCodegen, UnsupportedWeightTypeIsAClearError) {
  ModelFile m = load_model(kStories);
  Program p = compile_for_h200(m, ScheduleKind::dynamic, 64);
  cuda::CudaCodegenOptions o;
  o.weight_dtypes.assign(p.weights.size(), DType::I32);
  try {
    cuda::generate_cuda(p, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights of type i32 are not supported"), std::string::npos) << e.what();
  }
  // Matrices may be quantized, norm vectors may not (they are read element by element).
  o.weight_dtypes.assign(p.weights.size(), DType::Q8_0);
  try {
    cuda::generate_cuda(p, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0 norm/bias weights are not supported"), std::string::npos) << e.what();
  }
}

// One tile per block with few blocks (MK_CUDA_TILES_PER_WORKER=1, huge MK_CUDA_TILE_BYTES) makes
// matmul tiles wider than a block's shared memory: the tile pass narrows them to the backend's cap
// (max_matmul_tile_cols) instead of the code generator refusing the program.
TEST(CudaCodegen, WideTilesAreCappedToSharedMemory) {
  ModelFile m = load_synthetic_model("synth:stories15m", /*with_data=*/false);
  Graph g = build_graph(m, BuildOptions{64, false});
  CompileOptions co;
  co.workers = 2;
  co.max_tokens = 16;
  co.tiles_per_worker = 1;
  co.tile_bytes = int64_t{1} << 40;
  co.rms_partials = true;
  cuda::CudaCodegenOptions cg;
  cg.max_smem_bytes = 100 * 1024;
  // Without the cap: the logits tile (32000 / 2 columns) cannot be staged.
  EXPECT_THROW(cuda::generate_cuda(compile_program(g, co), cg), Error);
  cuda::apply_device_limits(co, cg.max_smem_bytes, cg.threads);
  Program p = compile_program(g, co);
  cuda::CudaSource src = cuda::generate_cuda(p, cg);
  EXPECT_LE(src.smem_bytes, static_cast<size_t>(cg.max_smem_bytes));
  int capped = 0;
  for (const OpDesc& op : p.ops) {
    if (op.opcode != Opcode::matmul) continue;
    const int64_t cap = cuda::max_matmul_tile_cols(p.weights[static_cast<size_t>(op.w)].dtype, op.k, cg.max_smem_bytes, cg.threads);
    EXPECT_LE(op.tile_cols, cap) << op.name;
    EXPECT_GT(op.tile_cols, 0) << op.name;
    if ((op.cols + 1) / 2 > cap) ++capped;  // one tile per worker would have been wider
  }
  EXPECT_GT(capped, 0) << "no matmul needed the cap: the test does not exercise it";
  // 100 KB = 25600 floats: rows of 288 floats (f32) leave (25600 - 36 - 64 - 288) / 9 columns.
  EXPECT_EQ(cuda::max_matmul_tile_cols(DType::F32, 288, 100 * 1024, 512), (25600 - 36 - 64 - 288) / 9);
  EXPECT_EQ(cuda::max_matmul_tile_cols(DType::F32, 1 << 20, 100 * 1024, 512), 0);
}

// Quantized rows on the device: raw ggml blocks, each row starting at a multiple of 16 bytes.
TEST(CudaCodegen, DeviceRowBytesPadsQuantizedRowsTo16) {
  EXPECT_EQ(cuda::device_row_bytes(DType::F32, 576), 576 * 4);
  EXPECT_EQ(cuda::device_row_bytes(DType::BF16, 576), 576 * 2);
  EXPECT_EQ(cuda::device_row_bytes(DType::Q4_1, 576), 368);   // 18 blocks of 20 = 360
  EXPECT_EQ(cuda::device_row_bytes(DType::Q8_0, 576), 624);   // 18 x 34 = 612
  EXPECT_EQ(cuda::device_row_bytes(DType::Q4_K, 512), 288);   // 2 x 144, already aligned
  EXPECT_EQ(cuda::device_row_bytes(DType::Q6_K, 256), 224);   // 210
  EXPECT_EQ(cuda::device_row_bytes(DType::Q4_0, 1536), 864);  // 48 x 18, already aligned
}

// The watchdog check's mutation: one wait asks for one signal more than its counter gets per step,
// which the validator rejects and no step can satisfy (the kernel must end in the watchdog error).
TEST(CudaCodegen, BreakOneWaitMakesAWaitUnsatisfiable) {
  ModelFile m = load_model(kStories);
  Program p = compile_for_h200(m, ScheduleKind::dynamic, 64);
  validate_program(p);
  Program broken = p;
  const int i = cuda::break_one_wait(broken);
  ASSERT_GE(i, 0);
  const Wait& w = broken.instrs[static_cast<size_t>(i)].waits.front();
  EXPECT_EQ(w.count, p.counters[static_cast<size_t>(w.counter)].signals_per_step + 1);
  EXPECT_THROW(validate_program(broken), Error);
  for (size_t j = static_cast<size_t>(i) + 1; j < p.instrs.size(); ++j) EXPECT_TRUE(p.instrs[j].waits.empty());
}

using test::run_cli;  // `megakernel ARGS`, stdout and stderr together

// compile --emit cuda writes the source the cuda backend compiles on an H200 (132 blocks, the
// megakernel alone); bench-copy without a device is a clear driver error.
TEST(CudaCli, EmitCudaWritesTheMegakernelSource) {
  int st = 0;
  const std::string out = ::testing::TempDir() + "/mk_stories.cu";
  std::string msg = run_cli("compile -m " + kStories + " --emit cuda -o " + out, &st);
  ASSERT_EQ(st, 0) << msg;
  std::ifstream f(out);
  std::string code((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(code.find("mk_megakernel"), std::string::npos);
  EXPECT_NE(code.find("#define MK_STATIC 0"), std::string::npos);
  EXPECT_EQ(code.find("mk_perop_0"), std::string::npos);
  ModelFile m = load_model(kStories);
  BuildOptions bo;
  bo.n_ctx = read_hparams(m).n_ctx_train;
  CompileOptions co;
  co.workers = 132;
  co.max_tokens = 256;
  co.attn_splits = 0;  // --emit cuda compiles what the cuda backends do: flash-decoding splits
  Program p = compile_program(build_graph(m, bo), co);
  EXPECT_NE(code.find(fmt::format("#define MK_NUM_INSTRS {}\n", p.instrs.size())), std::string::npos);
  EXPECT_NE(code.find("mk_attention_partial<"), std::string::npos);
  std::string stdout_src = run_cli("compile -m synth:micro --emit cuda", &st);
  ASSERT_EQ(st, 0);
  EXPECT_NE(stdout_src.find("mk_megakernel"), std::string::npos);

  std::string reason;
  if (!cuda::cuda_available(&reason)) {
    std::string copy = run_cli("bench-copy --mib 1 --reps 1", &st);
    EXPECT_EQ(st, 1);
    EXPECT_NE(copy.find("error: no CUDA driver"), std::string::npos) << copy;
  }
}
