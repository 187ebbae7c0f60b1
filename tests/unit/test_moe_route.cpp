// moe_route (ir/ops.def) on every backend with crafted router logits: the experts picked
// (descending probability, ties to the lower index, NaN never picked over a number, -inf last) are
// the same on reference, cpu and cuda-emu (whose template picks by a warp argmax instead of the
// serial loop), their weights the softmax probabilities, normalised or not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend/backend.h"
#include "ir/graph.h"
#include "ir/ops.h"
#include "model/model_file.h"

namespace mk {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();

struct RouteCase {
  ModelFile m;
  Graph g;
};

// Row i of `rows` is token i's router logits (an embedding table read by token id).
RouteCase route_graph(const std::vector<std::vector<float>>& rows, int64_t k, bool norm) {
  RouteCase c;
  const int64_t V = static_cast<int64_t>(rows.size()), E = static_cast<int64_t>(rows[0].size());
  auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(V * E * 4));
  for (int64_t v = 0; v < V; ++v) std::memcpy(buf->data() + v * E * 4, rows[static_cast<size_t>(v)].data(), static_cast<size_t>(E * 4));
  WeightTensor t;
  t.name = "router_logits";
  t.dtype = DType::F32;
  t.shape = {V, E};
  t.data = buf->data();
  t.nbytes = buf->size();
  c.m.path = "moe-route-test";
  c.m.format = "gguf";
  c.m.owned.push_back(buf);
  c.m.add_tensor(t);
  int tokens = c.g.add_input("tokens");
  int x = c.g.add(Op::embed, {c.g.add_weight("router_logits", DType::F32, {V, E}), tokens}, {}, "x");
  c.g.add_output(c.g.add(Op::moe_route, {x}, {{"k", k}, {"norm", int64_t{norm ? 1 : 0}}}, "route"), "logits");
  return c;
}

TEST(MoeRoute, EveryBackendPicksTheSameExperts) {
  std::vector<std::vector<float>> rows = {
      {0.5f, 2.0f, -1.0f, 2.0f, 0.1f, 3.0f, -4.0f, 0.0f},    // a tie between 1 and 3: 1 first
      {1.0f, kNaN, 1.0f, 1.0f, -kInf, 0.2f, 1.0f, 1.0f},     // NaN logit: every probability NaN
      {-kInf, -kInf, 0.0f, -kInf, 1.0f, -kInf, -kInf, 2.0f},  // -inf: probability 0
      {3.0f, 3.0f, 3.0f, 3.0f, 3.0f, 3.0f, 3.0f, 3.0f},       // all equal: 0, 1, 2
  };
  // 40 experts in a row (more than one lane's share of a warp): descending logits with ties
  std::vector<float> wide(40);
  for (int i = 0; i < 40; ++i) wide[static_cast<size_t>(i)] = static_cast<float>((i * 7) % 13) - 6.0f;
  for (auto& r : rows) r.resize(40, -50.0f);
  rows.push_back(wide);
  const std::vector<int32_t> ids = {0, 1, 2, 3, 4};
  for (const bool norm : {true, false}) {
    RouteCase c = route_graph(rows, 3, norm);
    std::vector<std::vector<float>> outs;
    for (const char* backend : {"reference", "cpu", "cuda-emu"}) {
      BackendOptions o;
      o.threads = 2;
      outs.push_back(make_backend(backend, c.g, c.m, o)->forward(ids, 0));
      ASSERT_EQ(outs.back().size(), ids.size() * 6) << backend;
    }
    for (size_t b = 1; b < outs.size(); ++b)
      for (size_t i = 0; i < outs[0].size(); ++i) {
        const bool id_col = i % 6 < 3;
        const float want = outs[0][i], got = outs[b][i];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << "backend " << b << " element " << i;
        } else if (id_col) {
          EXPECT_EQ(got, want) << "backend " << b << " element " << i;
        } else {
          EXPECT_NEAR(got, want, 1e-6f * std::max(1.0f, std::fabs(want))) << "backend " << b << " element " << i;
        }
      }
    const std::vector<float>& r = outs[0];
    EXPECT_EQ(r[0], 5.0f);  // the largest, then the tie 1 / 3 in index order
    EXPECT_EQ(r[1], 1.0f);
    EXPECT_EQ(r[2], 3.0f);
    EXPECT_EQ(r[6 * 2 + 0], 7.0f);  // -inf never beats a number
    EXPECT_EQ(r[6 * 2 + 1], 4.0f);
    EXPECT_EQ(r[6 * 2 + 2], 2.0f);
    EXPECT_EQ(r[6 * 3 + 0], 0.0f);  // all equal: the lowest indices
    EXPECT_EQ(r[6 * 3 + 1], 1.0f);
    EXPECT_EQ(r[6 * 3 + 2], 2.0f);
    // softmax over all 40: the weights of row 0; normalised they sum to 1
    double s = 0;
    for (int j = 0; j < 3; ++j) s += r[3 + j];
    if (norm) {
      EXPECT_NEAR(s, 1.0, 1e-6);
    } else {
      double z = 0;
      for (float v : rows[0]) z += std::exp(static_cast<double>(v) - 3.0);
      EXPECT_NEAR(r[3], 1.0 / z, 1e-6);
      EXPECT_LT(s, 1.0);
    }
  }
}

}  // namespace
}  // namespace mk
