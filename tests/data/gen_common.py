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


def write_tiny_llama(path, rng, n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx):
    """An f32 llama GGUF with random weights drawn from `rng` (gains that keep activations O(1)), for a
    quantizer to rewrite (llama_cpp_quantize)."""
    import gguf

    head_dim = n_embd // n_head

    def mat(n_out, n_in, gain=1.5):
        return (rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)).astype(np.float32)

    def norm_w(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.context_length", n_ctx)
    w.add_uint32("llama.embedding_length", n_embd)
    w.add_uint32("llama.block_count", n_layer)
    w.add_uint32("llama.feed_forward_length", n_ff)
    w.add_uint32("llama.attention.head_count", n_head)
    w.add_uint32("llama.attention.head_count_kv", n_head_kv)
    w.add_uint32("llama.rope.dimension_count", head_dim)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    add_placeholder_vocab(w, n_vocab)
    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float32))
    w.add_tensor("output_norm.weight", norm_w(n_embd))
    w.add_tensor("output.weight", mat(n_vocab, n_embd, 4.0))
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", norm_w(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_head_kv * head_dim, n_embd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_embd, 1.0))
        w.add_tensor(p + "ffn_norm.weight", norm_w(n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff, 1.0))
    finish_gguf(w)


def llama_cpp_quantize(src, out, ftype):
    """llama.cpp's quantizer (llama_model_quantize, one thread) from GGUF `src` to `out` with
    `ftype` (a llama_cpp.LLAMA_FTYPE_MOSTLY_* constant); returns {tensor name: ggml type name}."""
    import ctypes

    import gguf
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 1
    rc = llama_cpp.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(params))
    assert rc == 0, rc
    return {t.name: t.tensor_type.name.lower() for t in gguf.GGUFReader(out).tensors}


def quantized_llama_fixture(here, out_name, dims, weight_seed, prompt_seed, ftype):
    """A tiny random llama (write_tiny_llama with dims = (n_vocab, n_embd, n_layer, n_head, n_head_kv,
    n_ff, n_ctx)) quantized by llama.cpp with `ftype` to here/out_name, and here/expected.json:
    {"source", "prompt_ids" (20 ids), "types": {tensor: type}, "logits": llama.cpp's at every
    position (f32 KV cache)}. The f32 source is not kept."""
    n_vocab, n_ctx = dims[0], dims[-1]
    prompt = [int(x) for x in np.random.default_rng(prompt_seed).integers(3, n_vocab, size=20)]
    src, out = os.path.join(here, "tiny.f32.gguf"), os.path.join(here, out_name)
    write_tiny_llama(src, np.random.default_rng(weight_seed), *dims)
    types = llama_cpp_quantize(src, out, ftype)
    os.remove(src)
    logits = llama_cpp_logits(out, prompt, n_ctx)
    with open(os.path.join(here, "expected.json"), "w") as f:
        json.dump({"source": "llama-cpp-python 0.3.16 (llama.cpp), f32 KV cache", "prompt_ids": prompt,
                   "types": types, "logits": rounded(logits)}, f)
    print("wrote", out, sorted(set(types.values())), "argmax", logits.argmax(-1).tolist())


def gguf_tensor_name(name, top, parts):
    """An HF tensor name as llama.cpp's converter writes it: `top` maps whole names (embeddings, final
    norm, classifier), `parts` the middle of a layer's name (<prefix>.<layers>.N.<part>.<weight|bias>)."""
    if name in top:
        return top[name]
    _, _, il, rest = name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{il}.{parts[part]}.{kind}"


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


def write_expected(here, gguf_path, prompt, n_ctx, **extra):
    """llama.cpp's logits at every position of `prompt` for the GGUF (f32 KV cache) to
    here/expected.json ({"source", "prompt_ids", the `extra` fields, "logits"}); returns them."""
    logits = llama_cpp_logits(gguf_path, prompt, n_ctx)
    with open(os.path.join(here, "expected.json"), "w") as f:
        json.dump({"source": "llama-cpp-python 0.3.16 (llama.cpp), f32 KV cache", "prompt_ids": prompt, **extra,
                   "logits": rounded(logits)}, f)
    print("wrote", gguf_path, "logits", logits.shape, "argmax", logits.argmax(-1).tolist(),
          "max |logit|", float(np.abs(logits).max()))
    return logits
