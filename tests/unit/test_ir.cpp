#include <gtest/gtest.h>

#include "ir/graph.h"
#include "support/error.h"

using namespace mk;

TEST(IrSym, PrintParseRoundTrip) {
  for (std::string s : {"64", "n_tokens", "n_out + n_tokens", "2*n_tokens + 1", "n_out - 3", "-n_tokens"}) {
    EXPECT_EQ(SymExpr::parse(s).str(), s);
  }
  EXPECT_EQ((SymExpr::out() + SymExpr::tokens()).eval({5, 7}), 12);
  EXPECT_THROW(SymExpr::parse("n_foo"), Error);
}

TEST(IrGraph, BuildPrintParseRoundTrip) {
  Graph g;
  int tok = g.add_input("tokens");
  int emb = g.add_weight("token_embd.weight", DType::F32, {512, 64});
  int x = g.add(Op::embed, {emb, tok}, {}, "inp_embd");
  int w = g.add_weight("blk.0.attn_norm.weight", DType::F32, {64});
  int n = g.add(Op::rms_norm, {x, w}, {{"eps", 1e-5}}, "blk.0.attn_norm");
  int wq = g.add_weight("blk.0.attn_q.weight", DType::BF16, {64, 64});
  int q = g.add(Op::matmul, {n, wq}, {}, "blk.0.q");
  g.add_output(g.add(Op::last_row, {q}), "out");
  verify_graph(g);
  std::string text = g.str();
  EXPECT_NE(text.find("%6 = matmul %4, %5 : f32[n_tokens, 64] \"blk.0.q\""), std::string::npos) << text;
  Graph g2 = parse_graph(text);
  EXPECT_EQ(g2.str(), text);
}

TEST(IrGraph, ShapeMismatchIsAnError) {
  Graph g;
  int tok = g.add_input("tokens");
  int emb = g.add_weight("token_embd.weight", DType::F32, {512, 64});
  int x = g.add(Op::embed, {emb, tok});
  int wq = g.add_weight("wq", DType::F32, {64, 32});
  try {
    g.add(Op::matmul, {x, g.add_weight("bad", DType::F32, {64, 65})});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inner dimension mismatch: 64 vs 65"), std::string::npos) << e.what();
  }
  (void)wq;
}

TEST(IrGraph, ParserRejectsWrongDeclaredType) {
  std::string text =
      "graph {\n  %0 = input {kind=\"tokens\"} : i32[n_tokens]\n"
      "  %1 = weight @t : f32[10, 4]\n  %2 = embed %1, %0 : f32[n_tokens, 5]\n  output %2 \"x\"\n}\n";
  EXPECT_THROW(parse_graph(text), Error);
}
