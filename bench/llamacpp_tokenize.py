#!/usr/bin/env python3
"""Tokenization of GGUF vocabularies, megakernel against llama.cpp (llama-cpp-python), side by side.

For every model file and every text below, with and without parse_special and BOS, compares
`megakernel tokenize --json` with llama.cpp's `Llama.tokenize`; prints each difference and exits 1
if there is one. Besides the files given with --model it writes variants of the vocabularies in
../shared and SmolLM2 (when fetched) that exercise llama.cpp's special-token rules:
control and user-defined pieces in a SentencePiece vocabulary, an end-of-generation name typed
user-defined (llama.cpp makes it control), and a vocabulary named Phi-3 (special tokens take the
whitespace after them).

Run with the venv that bench/llamacpp_compare.sh makes (llama-cpp-python, gguf, numpy):
  ~/.cache/megakernel/venvs/llamacpp/bin/python bench/llamacpp_tokenize.py [--megakernel BIN] [--model F ...]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

TEXTS = [
    "Hello world", " leading space", "  two  spaces ", "", "é<s>ü", "Once upon a time<s>there",
    "<s>hi</s>", "<s>[INST] hi [/INST]", "a</s>b", "</s> </s>", "<unk> x", "<s> x", "x <s>", "\n<s>\n", "<s>",
    "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>x", "<|im_start|><|im_start|>", "<|im_end|> z", "q <|im_end|>",
    "<start_of_turn>user\nhi<end_of_turn>\n", "x<end_of_turn>y", " <start_of_turn> ",
    "<|user|>\nhi<|end|>\n<|assistant|>\n", "<|system|>  \t x<|end|>", "a<|endoftext|> b", "<|user|> ",
    "x<|end|>\n\n", "<|assistant|>\r\nok",
]


def variant(src, dst, name, replace):
    """A copy of GGUF `src` with tokens replaced ({id: (text, type)}) and general.name set."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(src)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = GGUFWriter(dst, arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k in ("general.architecture", "general.name"):
            continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            st = f.types[1]
            if st == GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
            else:
                vals = [f.parts[i][0].item() for i in f.data]
            for i, (text, ty) in replace.items():
                if k == "tokenizer.ggml.tokens" and text is not None:
                    vals[i] = text
                if k == "tokenizer.ggml.token_type":
                    vals[i] = ty
            w.add_key_value(k, vals, t, sub_type=st)
        elif t == GGUFValueType.STRING:
            w.add_key_value(k, bytes(f.parts[-1]).decode(), t)
        else:
            w.add_key_value(k, f.parts[-1][0].item(), t)
    w.add_name(name)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def compare(llama_cpp, binary, path):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    diffs = 0
    for text in TEXTS:
        for special in (False, True):
            for bos in (True, False):
                ref = llm.tokenize(text.encode(), add_bos=bos, special=special)
                args = [binary, "tokenize", "-m", path, "-p", text, "--json"]
                args += ["--parse-special"] if special else []
                args += [] if bos else ["--no-bos"]
                r = subprocess.run(args, capture_output=True, text=True)
                ours = json.loads(r.stdout)["ids"] if r.returncode == 0 else r.stderr.strip()
                if ours != ref:
                    diffs += 1
                    print(f"  DIFF {text!r} special={special} bos={bos}: llama.cpp {ref}, megakernel {ours}")
    print(f"{os.path.basename(path)}: {len(TEXTS) * 4 - diffs}/{len(TEXTS) * 4} equal")
    return diffs


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "megakernel")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megakernel", default=os.path.join(root, "build", "megakernel"))
    ap.add_argument("--model", action="append", default=[])
    a = ap.parse_args()
    import llama_cpp

    stories = os.path.join(root, "..", "shared", "models", "stories260K", "stories260K.gguf")
    smollm2 = os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    tmp = tempfile.mkdtemp(prefix="mk_tokcmp_")
    models = list(a.model) + [stories]
    chat = {500: ("<|user|>", 4), 501: ("<|end|>", 4), 502: ("<|assistant|>", 3), 503: ("<|endoftext|>", 3),
            504: ("<|system|>", 4), 505: ("<start_of_turn>", 4), 506: ("<end_of_turn>", 4)}
    models.append(variant(stories, os.path.join(tmp, "spm_chat.gguf"), "spm test", chat))
    models.append(variant(stories, os.path.join(tmp, "spm_phi3.gguf"), "Phi-3-mini-4k-instruct", chat))
    if os.path.exists(smollm2):
        models.append(smollm2)
        # llama.cpp's Phi-3 rule looks up <s>, </s>, <unk> by name: give the vocabulary those.
        models.append(variant(smollm2, os.path.join(tmp, "bpe_phi3.gguf"), "Phi3 bpe test",
                              {2: (None, 4), 6: ("<|user|>", 4), 7: ("<s>", 3), 13: ("</s>", 3), 16: ("<unk>", 3)}))
    try:
        diffs = sum(compare(llama_cpp, a.megakernel, m) for m in models)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
