// Synthetic models in real shapes (synth:llama3.2-1b, synth:llama3.1-8b): hyperparameters, tensor
// shapes and sizes, that the graph builds and (1B) the program compiles for 132 workers, all from
// tensors without data (the weights are 2.5 GB and 16 GB; tests never allocate them). Small
// synthetic models check that the parallel fill is deterministic.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>

#include "archs/arch.h"
#include "model/synth.h"
#include "quant/quant.h"
#include "support/error.h"
#include "passes/pass.h"

namespace mk {
namespace {

int64_t total_bytes(const ModelFile& m) {
  int64_t b = 0;
  for (const WeightTensor& t : m.tensors()) b += static_cast<int64_t>(t.nbytes);
  return b;
}

struct Expect {
  const char* name;
  int64_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab;
  bool tied;
  double gb;  // weight bytes / 1e9 (TARGETS.md)
};

void PrintTo(const Expect& e, std::ostream* os) { *os << e.name; }

class SynthRealShapes : public testing::TestWithParam<Expect> {};

TEST_P(SynthRealShapes, ShapesAndProgramWithoutData) {
  const Expect e = GetParam();
  SynthSpec s = synthetic_spec(e.name);
  EXPECT_EQ(s.dtype, DType::BF16);
  ModelFile m = make_synthetic_model(s, /*with_data=*/false);
  Hparams hp = read_hparams(m);
  EXPECT_EQ(hp.n_embd, e.n_embd);
  EXPECT_EQ(hp.n_layer, e.n_layer);
  EXPECT_EQ(hp.n_head, e.n_head);
  EXPECT_EQ(hp.n_head_kv, e.n_head_kv);
  EXPECT_EQ(hp.head_dim, e.head_dim);
  EXPECT_EQ(hp.n_ff, e.n_ff);
  EXPECT_EQ(hp.n_vocab, e.n_vocab);
  EXPECT_EQ(m.find("output.weight") == nullptr, e.tied);
  const int64_t kv = e.n_head_kv * e.head_dim;
  EXPECT_EQ(m.get("blk.0.attn_k.weight").shape, (std::vector<int64_t>{kv, e.n_embd}));
  EXPECT_EQ(m.get("blk.0.attn_q.weight").shape, (std::vector<int64_t>{e.n_head * e.head_dim, e.n_embd}));
  EXPECT_EQ(m.get("blk.0.ffn_down.weight").shape, (std::vector<int64_t>{e.n_embd, e.n_ff}));
  EXPECT_EQ(m.get("token_embd.weight").shape, (std::vector<int64_t>{e.n_vocab, e.n_embd}));
  EXPECT_EQ(m.get("blk.0.ffn_up.weight").dtype, DType::BF16);
  EXPECT_EQ(m.get("blk.0.ffn_up.weight").data, nullptr);
  EXPECT_NEAR(static_cast<double>(total_bytes(m)) / 1e9, e.gb, 0.01 * e.gb);

  BuildOptions bo;
  bo.n_ctx = 256;
  Graph g = build_graph(m, bo);
  // The passes take ~30 s on the full 8B program (memplan and the validator are superlinear in its
  // 56k instructions): compile the 1B one only.
  if (e.n_layer > 16) return;
  CompileOptions co;
  co.workers = 132;
  co.max_tokens = 16;
  Program p = compile_program(g, co);
  int64_t program_bytes = 0;
  for (const ProgramWeight& w : p.weights) {
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    program_bytes += static_cast<int64_t>(dtype_bytes(w.dtype, n));
  }
  EXPECT_EQ(program_bytes, total_bytes(m));  // every weight is read once per token
}

INSTANTIATE_TEST_SUITE_P(Real, SynthRealShapes,
                         testing::Values(Expect{"llama3.2-1b", 2048, 16, 32, 8, 64, 8192, 128256, true, 2.47},
                                         Expect{"llama3.1-8b", 4096, 32, 32, 8, 128, 14336, 128256, false, 16.06}),
                         [](const auto& info) { return std::string(info.param.name[7] == '2' ? "Llama32_1B" : "Llama31_8B"); });

TEST(Synth, ParallelFillIsDeterministicAndSmallTensorsUnchanged) {
  SynthSpec s = synthetic_spec("stories15m");  // token_embd: 32000 x 288 = 9.2 M elements, several chunks
  s.dtype = DType::BF16;
  ModelFile a = make_synthetic_model(s), b = make_synthetic_model(s);
  for (const WeightTensor& t : a.tensors()) {
    const WeightTensor& u = b.get(t.name);
    ASSERT_EQ(t.nbytes, u.nbytes);
    EXPECT_EQ(std::memcmp(t.data, u.data, t.nbytes), 0) << t.name;
  }
  // Chunks differ from each other (no repeated stream).
  const WeightTensor& e = a.get("token_embd.weight");
  EXPECT_NE(std::memcmp(e.data, e.data + (size_t{1} << 21), 4096), 0);
  EXPECT_THROW(synthetic_spec("llama3.2-1b-nosuch"), Error);
}

// synth:<name>:<ggml type>: the f32 synthetic weights quantized (quant::quantize_model's bytes), rows
// that are not whole blocks falling back to q8_0 (stories260k's 64-wide rows for q4_K) or f32 (its
// 172-wide ffn_down); shapes-only gives the same dtypes and sizes; a bad name lists the types.
TEST(Synth, QuantizedTypeEqualsQuantizeModelOfTheF32Weights) {
  const ModelFile f32 = load_synthetic_model("synth:stories260k");
  for (auto [type, fallback] : {std::pair{DType::Q4_1, std::optional<DType>{}}, std::pair{DType::Q4_K, std::optional<DType>{DType::Q8_0}}}) {
    const std::string path = "synth:stories260k:" + std::string(dtype_name(type));
    const ModelFile q = load_synthetic_model(path);
    const ModelFile want = quant::quantize_model(f32, type, fallback);
    const ModelFile shapes = load_synthetic_model(path, false);
    ASSERT_EQ(q.tensors().size(), want.tensors().size());
    int quantized = 0;
    for (const WeightTensor& w : want.tensors()) {
      const WeightTensor& t = q.get(w.name);
      EXPECT_EQ(t.dtype, w.dtype) << path << " " << w.name;
      EXPECT_EQ(shapes.get(w.name).dtype, w.dtype) << path << " " << w.name;
      EXPECT_EQ(shapes.get(w.name).nbytes, w.nbytes) << path << " " << w.name;
      ASSERT_EQ(t.nbytes, w.nbytes) << path << " " << w.name;
      EXPECT_EQ(std::memcmp(t.data, w.data, w.nbytes), 0) << path << " " << w.name;
      quantized += dtype_is_quantized(t.dtype);
    }
    EXPECT_EQ(q.get("blk.0.ffn_down.weight").dtype, DType::F32) << path;  // 172 columns
    EXPECT_EQ(q.get("blk.0.attn_q.weight").dtype, type == DType::Q4_K ? DType::Q8_0 : DType::Q4_1) << path;
    EXPECT_GE(quantized, 30) << path;
  }
  try {
    load_synthetic_model("synth:stories260k:q9_9");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'q9_9' (f32, f16, bf16, "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("q4_K"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mk
