// The reference backend and the Llama description on small random models.
#include <gtest/gtest.h>

#include "support/compare.h"

#include <cmath>

#include "archs/arch.h"
#include "backend/backend.h"
#include "support/error.h"
#include "support/tiny_model.h"

using namespace mk;

namespace {
using test::rel_l2;
}  // namespace

// Prefill of the whole sequence and token-by-token decode through the KV cache must agree: this
// checks kv_store, causal masking with n_past, and RoPE positions.
TEST(ReferenceBackend, PrefillEqualsIncrementalDecode) {
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    test::TinyLlama c;
    c.dtype = dt;
    ModelFile m = test::make_tiny_llama(c);
    Graph all = build_graph(m, {32, true});
    Graph last = build_graph(m, {32, false});
    auto ref_all = make_backend("reference", all, m, {});
    auto ref_last = make_backend("reference", last, m, {});
    std::vector<int32_t> ids = {1, 5, 9, 47, 3, 3, 20};
    std::vector<float> prefill = ref_all->forward(ids, 0);
    ASSERT_EQ(prefill.size(), ids.size() * 48);
    for (size_t t = 0; t < ids.size(); ++t) {
      std::vector<float> step = ref_last->forward(std::span<const int32_t>(&ids[t], 1), static_cast<int64_t>(t));
      ASSERT_EQ(step.size(), 48u);
      std::vector<float> row(prefill.begin() + static_cast<long>(t * 48), prefill.begin() + static_cast<long>((t + 1) * 48));
      EXPECT_LT(rel_l2(step, row), 1e-5) << "position " << t << " dtype " << dtype_name(dt);
    }
  }
}

TEST(ReferenceBackend, ResetForgetsTheCache) {
  ModelFile m = test::make_tiny_llama({});
  Graph g = build_graph(m, {16, false});
  auto b = make_backend("reference", g, m, {});
  std::vector<int32_t> ids = {2, 7, 11};
  auto first = b->forward(ids, 0);
  b->reset();
  EXPECT_EQ(b->forward(ids, 0), first);
  EXPECT_THROW(b->forward(ids, 15), Error);  // 15 + 3 > 16 rows of cache
}

TEST(ReferenceBackend, TiedClassifierUsesTheEmbedding) {
  test::TinyLlama c;
  c.tied = true;
  ModelFile m = test::make_tiny_llama(c);
  Graph g = build_graph(m, {16, false});
  EXPECT_NE(g.str().find("%" + std::to_string(g.outputs[0].value - 1) + " = matmul"), std::string::npos);
  auto b = make_backend("reference", g, m, {});
  std::vector<int32_t> ids = {4};
  EXPECT_EQ(b->forward(ids, 0).size(), 48u);
}

TEST(ReferenceBackend, TokenIdOutsideTheTableIsAnError) {
  ModelFile m = test::make_tiny_llama({});
  Graph g = build_graph(m, {16, false});
  auto b = make_backend("reference", g, m, {});
  std::vector<int32_t> ids = {48};
  EXPECT_THROW(b->forward(ids, 0), Error);
}

TEST(ReferenceArch, ShapeThatDoesNotMatchTheArchitectureIsNamed) {
  test::TinyLlama c;
  ModelFile good = test::make_tiny_llama(c);
  // Rebuild with blk.1.attn_k.weight declared one row short.
  ModelFile bad;
  bad.path = good.path;
  bad.format = good.format;
  bad.metadata = good.metadata;
  bad.owned = good.owned;
  for (WeightTensor t : good.tensors()) {
    if (t.name == "blk.1.attn_k.weight") t.shape = {15, 32};
    bad.add_tensor(t);
  }
  try {
    build_graph(bad, {16, false});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), bad.path + ": tensor blk.1.attn_k.weight has shape [15, 32], expected [16, 32]");
  }
}

TEST(ReferenceArch, UnknownArchitectureListsSupportedOnes) {
  ModelFile m = test::make_tiny_llama({});
  m.metadata["general.architecture"] = "mamba";
  try {
    build_graph(m, {16, false});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported architecture 'mamba'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gguf:llama"), std::string::npos) << e.what();
  }
}

TEST(ReferenceArch, MissingMetadataKeyIsNamed) {
  ModelFile m = test::make_tiny_llama({});
  m.metadata.erase("llama.block_count");
  try {
    build_graph(m, {16, false});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama.block_count"), std::string::npos) << e.what();
  }
}
