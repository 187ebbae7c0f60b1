// A small random-weight Llama ModelFile (the synthetic-model generator at a test-sized shape), for
// tests that need particular shapes, dtypes or a tied classifier without a file on disk.
#pragma once
#include "model/synth.h"

namespace mk::test {

struct TinyLlama {
  int64_t n_vocab = 48, n_embd = 32, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 40, n_ctx = 64;
  DType dtype = DType::F32;
  bool tied = false;  // drop output.weight: the classifier is the token embedding
  uint64_t seed = 1;
};

inline ModelFile make_tiny_llama(const TinyLlama& c) {
  SynthSpec s;
  s.name = "tiny-test";
  s.n_vocab = c.n_vocab, s.n_embd = c.n_embd, s.n_layer = c.n_layer, s.n_head = c.n_head;
  s.n_head_kv = c.n_head_kv, s.n_ff = c.n_ff, s.n_ctx = c.n_ctx, s.dtype = c.dtype, s.seed = c.seed;
  ModelFile m = make_synthetic_model(s);
  if (!c.tied) return m;
  ModelFile t;
  t.path = m.path;
  t.format = m.format;
  t.metadata = m.metadata;
  t.files = m.files;
  t.owned = m.owned;
  for (const WeightTensor& w : m.tensors())
    if (w.name != "output.weight") t.add_tensor(w);
  return t;
}

}  // namespace mk::test
