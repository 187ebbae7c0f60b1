"""What the fixture generators in tests/data/*/gen_*.py share (run by hand, with llama-cpp-python,
gguf and numpy in the venv; see docs/architectures.md): GGUF writing with a placeholder vocabulary,
the HF directory (config.json + one f32 model.safetensors), and llama.cpp's logits as the oracle.
A generator puts this folder on sys.path and imports it; the fixtures it writes do not change.
"""
import json
import os
import struct

import numpy as np


def add_placeholder_vocab(w, n_vocab):
    """A SentencePiece vocabulary of n_vocab pieces (llama.cpp takes n_vocab from it): <unk>, <s>,
    </s>, <0x0A>, t4 ..."""
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>"] + [f"t{i}" for i in range(4, n_vocab)]
    w.add_string("tokenizer.ggml.model", "llama")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.scores", [0.0] * n_vocab)
    w.add_array("tokenizer.ggml.token_type", [2, 3, 3, 6] + [1] * (n_vocab - 4))
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_uint32("tokenizer.ggml.unknown_token_id", 0)


def finish_gguf(w):
    """Writes a gguf.GGUFWriter's header, metadata and tensors, and closes it."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_safetensors(path, tensors):
    """One safetensors file of f32 tensors, in the dict's order, header padded to 8 bytes."""
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        b = np.ascontiguousarray(t, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_hf(folder, config, tensors):
    """An HF model directory: config.json (indent 2) and model.safetensors."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    write_safetensors(os.path.join(folder, "model.safetensors"), tensors)


def llama_cpp_logits(path, prompt, n_ctx):
    """llama.cpp's logits at every position of `prompt` (f32 KV cache, no flash attention)."""
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, logits_all=True, verbose=False,
                type_k=0, type_v=0, flash_attn=False, seed=0)  # type 0 = GGML_TYPE_F32 KV cache
    assert llm.n_ctx() == n_ctx, llm.n_ctx()
    llm.eval(prompt)
    return np.array(llm.scores[: len(prompt)], dtype=np.float32)


def rounded(logits):
    """Logits rows as JSON lists, 7 significant digits."""
    return [[float(f"{x:.7g}") for x in row] for row in logits]
