#!/usr/bin/env python3
"""Writes a tiny GPT-2 in this folder and llama.cpp's logits for it (run by hand).

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/gpt2/gen_gpt2.py

(llama-cpp-python 0.3.16 with gguf and numpy; see docs/architectures.md). Outputs, next to this script:
  gpt2-tiny.f32.gguf  GGUF arch `gpt2` as llama.cpp's convert_hf_to_gguf.py (GPT2Model) writes it:
                      the Conv1D weights transposed to [n_out, n_in], c_attn kept fused as
                      blk.N.attn_qkv.{weight,bias}, no output.weight (tied to token_embd); f32.
  hf/config.json, hf/model.safetensors
                      the same weights as a transformers GPT2LMHeadModel directory (Conv1D [n_in, n_out]).
  expected.json       llama.cpp's logits at every position (f32 KV cache) of a 24-token prompt.
"""
import os
import sys

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import add_placeholder_vocab, finish_gguf, gguf_tensor_name, write_expected, write_hf as write_hf_dir  # noqa: E402

N_VOCAB, N_EMBD, N_LAYER, N_HEAD, N_CTX_TRAIN, EPS = 128, 48, 2, 4, 64, 1e-5
PROMPT = [int(x) for x in np.random.default_rng(12).integers(3, N_VOCAB, size=24)]

rng = np.random.default_rng(2024)


def rand(*shape, std=0.08):
    return (rng.standard_normal(shape) * std).astype(np.float32)


# transformers' names and layouts (Conv1D weights [n_in, n_out])
hf = {"transformer.wte.weight": rand(N_VOCAB, N_EMBD, std=0.5), "transformer.wpe.weight": rand(N_CTX_TRAIN, N_EMBD, std=0.3),
      "transformer.ln_f.weight": 1 + rand(N_EMBD, std=0.1), "transformer.ln_f.bias": rand(N_EMBD, std=0.1)}
for il in range(N_LAYER):
    p = f"transformer.h.{il}."
    for n in ("ln_1", "ln_2"):
        hf[p + n + ".weight"] = 1 + rand(N_EMBD, std=0.1)
        hf[p + n + ".bias"] = rand(N_EMBD, std=0.1)
    hf[p + "attn.c_attn.weight"] = rand(N_EMBD, 3 * N_EMBD, std=0.25)
    hf[p + "attn.c_attn.bias"] = rand(3 * N_EMBD, std=0.1)
    hf[p + "attn.c_proj.weight"] = rand(N_EMBD, N_EMBD, std=0.2)
    hf[p + "attn.c_proj.bias"] = rand(N_EMBD, std=0.1)
    hf[p + "mlp.c_fc.weight"] = rand(N_EMBD, 4 * N_EMBD, std=0.2)
    hf[p + "mlp.c_fc.bias"] = rand(4 * N_EMBD, std=0.1)
    hf[p + "mlp.c_proj.weight"] = rand(4 * N_EMBD, N_EMBD, std=0.15)
    hf[p + "mlp.c_proj.bias"] = rand(N_EMBD, std=0.1)

GGUF_PARTS = {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
              "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
GGUF_TOP = {"transformer.wte.weight": "token_embd.weight", "transformer.wpe.weight": "position_embd.weight",
            "transformer.ln_f.weight": "output_norm.weight", "transformer.ln_f.bias": "output_norm.bias"}


def gguf_name(name):
    return gguf_tensor_name(name, GGUF_TOP, GGUF_PARTS)


def write_gguf(path):
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_uint32("gpt2.block_count", N_LAYER)
    w.add_uint32("gpt2.context_length", N_CTX_TRAIN)
    w.add_uint32("gpt2.embedding_length", N_EMBD)
    w.add_uint32("gpt2.feed_forward_length", 4 * N_EMBD)
    w.add_uint32("gpt2.attention.head_count", N_HEAD)
    w.add_float32("gpt2.attention.layer_norm_epsilon", EPS)
    add_placeholder_vocab(w, N_VOCAB)
    for name, t in hf.items():
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            t = np.ascontiguousarray(t.T)  # convert_hf_to_gguf.py GPT2Model: Conv1D transposed
        w.add_tensor(gguf_name(name), t.astype(np.float32))
    finish_gguf(w)


def write_hf(folder):
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "torch_dtype": "float32",
        "activation_function": "gelu_new", "vocab_size": N_VOCAB, "n_embd": N_EMBD, "n_layer": N_LAYER,
        "n_head": N_HEAD, "n_inner": None, "n_positions": N_CTX_TRAIN, "layer_norm_epsilon": EPS,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    }
    write_hf_dir(folder, config, hf)


def main():
    path = os.path.join(HERE, "gpt2-tiny.f32.gguf")
    write_gguf(path)
    write_hf(os.path.join(HERE, "hf"))
    write_expected(HERE, path, PROMPT, N_CTX_TRAIN)

if __name__ == "__main__":
    main()
