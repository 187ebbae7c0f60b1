#!/usr/bin/env python3
"""Writes llama.cpp's embeddings for two GGUF models, the oracle of tests/e2e/test_embed.cpp (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/embeddings/gen_embeddings.py [SHARED_DIR]

(the venv has llama-cpp-python 0.3.16). SHARED_DIR defaults to ../shared beside the repository.
Models: stories260K.gguf from SHARED_DIR (f32 weights) and tests/data/iq4_nl/tiny-q3_k_m.gguf
(quantized: llama.cpp's 8-bit activations, as megakernel's cpu for such files); llama.cpp with an
f32 KV cache for both (with its default f16 cache the tiny random model's vectors differ from ours by
2e-3 to 8e-3 rel L2 on some inputs: a last-bit difference in an f16 Q.K sum flips an 8-bit activation,
the rounding flips docs/quantization.md describes; on other inputs they agree to 1e-7). Each input is embedded alone
(Llama.embed, normalize as named) with pooling mean, cls, last and none. Writes expected.json:
  {"models": [{"name", "path" (relative to SHARED_DIR or the repository), "n_ctx",
               "inputs": [[ids]], "texts": [text or null],
               "cases": [{"pooling", "normalize", "embeddings": [per input: [n_embd] or [[n_embd] per token]]}]}]}
Inputs are token ids (llama.cpp's tokenization of the texts, BOS included) so that the test checks the
model alone; `texts` let a test check the tokenization too. The stories260K inputs include one of 300
tokens (more than a step's 256 rows).
"""
import json
import os
import sys

import llama_cpp
from llama_cpp import Llama

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SHARED = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(REPO), "shared")

POOLINGS = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
            "last": llama_cpp.LLAMA_POOLING_TYPE_LAST, "none": llama_cpp.LLAMA_POOLING_TYPE_NONE}
F32 = 0  # GGML_TYPE_F32


def embed_ids(path, n_ctx, ids, pooling, normalize, kv_f32):
    kw = dict(type_k=F32, type_v=F32) if kv_f32 else {}
    llm = Llama(path, embedding=True, pooling_type=POOLINGS[pooling], n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                n_threads=2, verbose=False, flash_attn=False, **kw)
    llm.tokenize = lambda text, *a, **k: list(ids)  # the input as given, nothing added
    out = llm.embed("x", normalize=normalize)
    del llm
    return [[round(float(v), 8) for v in row] for row in out] if pooling == "none" else [round(float(v), 8) for v in out]


def model_case(name, path, rel, n_ctx, texts, kv_f32, extra_ids=()):
    tok = Llama(path, vocab_only=True, verbose=False)
    inputs = [tok.tokenize(t.encode(), add_bos=True, special=True) for t in texts] + [list(x) for x in extra_ids]
    cases = []
    for pooling, normalize in [("mean", True), ("cls", True), ("last", True), ("mean", False), ("none", True)]:
        cases.append({"pooling": pooling, "normalize": normalize,
                      "embeddings": [embed_ids(path, n_ctx, ids, pooling, normalize, kv_f32) for ids in inputs]})
    return {"name": name, "path": rel, "n_ctx": n_ctx, "inputs": inputs,
            "texts": list(texts) + [None] * len(extra_ids), "cases": cases}


if __name__ == "__main__":
    story = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
             "One day, she saw a big red ball under a tree. ")
    long_text = (story * 12)
    stories = os.path.join(SHARED, "models", "stories260K", "stories260K.gguf")
    m1 = model_case("stories260K", stories, "models/stories260K/stories260K.gguf", 512,
                    ["Once upon a time", "Lily liked the park", "A", long_text], kv_f32=True)
    assert len(m1["inputs"][3]) > 256, len(m1["inputs"][3])
    m1["inputs"][3] = m1["inputs"][3][:300]  # 300 tokens: two steps of the cpu program's 256 rows
    m1 = model_case("stories260K", stories, "models/stories260K/stories260K.gguf", 512,
                    ["Once upon a time", "Lily liked the park", "A"], kv_f32=True, extra_ids=[m1["inputs"][3]])
    tiny = os.path.join(REPO, "tests", "data", "iq4_nl", "tiny-q3_k_m.gguf")
    m2 = model_case("tiny-q3_k_m", tiny, "tests/data/iq4_nl/tiny-q3_k_m.gguf", 64, [], kv_f32=True,
                    extra_ids=[[1, 5, 9, 17, 33, 65, 127, 2, 40, 41, 42], [1, 100], [1] + list(range(3, 60))])
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump({"generator": "llama-cpp-python " + llama_cpp.__version__, "models": [m1, m2]}, f)
        f.write("\n")
