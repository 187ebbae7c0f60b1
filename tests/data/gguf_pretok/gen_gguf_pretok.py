#!/usr/bin/env python3
"""Generates expected.json: llama.cpp's token ids for GGUF byte-level BPE vocabularies under each
`tokenizer.ggml.pre` value (tests/unit/test_tokenizer_gguf_bpe.cpp, TokenizerGgufBpe.PreTokenizersMatchLlamaCpp).

The vocabulary is made here: the 256 byte characters of GPT-2's alphabet (ids 0..255), then merges
learned on the test texts themselves without any pre-tokenization: every pair of adjacent bytes
first, then longer tokens (so tokens span spaces, tabs, punctuation, digits and case changes, and
the places a pre-tokenizer cuts show in the ids), then a
control token <|bos|> as BOS. Each pre-tokenizer's vocab-only GGUF is tokenized by llama.cpp
(llama-cpp-python, vocab_only=True, add_bos=False, special=False); the file records the tokens, the
merges, the texts and, per pre-tokenizer, the ids and whether llama.cpp adds BOS when the file has
no tokenizer.ggml.add_bos_token. The C++ test rebuilds the vocabulary from the file, so it needs
neither Python nor a model.

    ~/.cache/megakernel/venvs/llamacpp/bin/python tests/data/gguf_pretok/gen_gguf_pretok.py
"""
import json
import os
import random
import sys
import tempfile

import gguf
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_common import finish_gguf  # noqa: E402

# One name of each family megakernel knows, and every new or changed name with its aliases.
PRES = ["default", "llama-bpe", "dbrx", "chatglm-bpe", "gpt-2", "qwen2", "smollm", "falcon", "bloom", "poro-chat",
        "gpt3-finnish", "viking", "seed-coder", "tekken", "gpt-4o", "llama4", "deepseek-llm", "deepseek-coder", "deepseek-v3"]

# Whitespace runs, tabs, newlines, contractions, digits, punctuation, parentheses, case changes,
# CJK, emoji, accents and other scripts.
TEXTS = [
    "", " ", "x", "Hello world", "  leading  spaces", "trailing   ", "a  b   c    d",
    "x\t\ty", "\t", "tabs\tand\nnewlines\n\n\n", "   \n\n  \t\t ", "a\r\nb\rc", " \n \n x", "...\n\n",
    "'s 's 'S 'Re", "don't I'LL we've they'D", "it's John's JOHN'S 'll've", "f(x):", "(a|b) [c] {d} <e>",
    "1234567", "123456 1234567 9999999999", "3.14159 1,000,000 -42", "A1B2C3 x2y", "\u0663\u0664\u0665 \u216b \u2460\u2461",
    "Hello,world!How are-you?", "!!! ??? ... --- ___", "a//b /path/to/file\n", "x = y + z; // comment",
    "\u00bb\u00ab\u201cquotes\u201d \u2018x\u2019", "    def f(x):\n        return x**2\n",
    "\u4f60\u597d\uff0c\u4e16\u754c \u65e5\u672c\u8a9e", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\u30ab\u30bf\u30ab\u30ca",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u4e2d\u6587\uff0c\u6807\u70b9\u3002\u3001\u201c\u5f15\u53f7\u201d",
    "\U0001F600\U0001F44D\U0001F3FD emoji", "\U0001F1FA\U0001F1F8\U0001F1EB\U0001F1F7", "\U0001F468\u200d\U0001F469\u200d\U0001F467 family",
    "caf\u00e9 na\u00efve \u00fcber", "e\u0301 combining a\u0308", "\u01c5emo \u03a3\u03af\u03c3\u03c5\u03c6\u03bf\u03c2 \u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3",
    "\u00c9COLE \u00c9cole \u00e9COLE", "Stra\u00dfe STRASSE", "HelloWorld camelCase XMLHttpRequest iPhone",
    "CamelCaseWORDSAndMore ABCdef abcDEF", "\u00a0\u2009\u3000 unicode spaces\u00a0", "a\u0085b \u2028c",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e\u0964", "\u0645\u0631\u062d\u0628\u0627\u060c \u0639\u0627\u0644\u0645\u06d4",
    "\ufb01 \u210c \u2126 \u212a \u1f08\u03b8\u1fc6\u03bd\u03b1\u03b9 \u1f65\u03c1\u03b1", "Hello\u200bworld", "x" * 40 + " y",
    "<|im_start|> <s> </s>", "I'm   'twas  Rock'n'Roll", "HTTP/1.1 200 OK\r\n\r\n",
]
random.seed(11)
TEXTS.append("".join(random.choice(["a", " ", "\n", "\u00e9", "\u4e2d", "\U0001F600", "1", ".", "'s", "  ", "\t", "\u01c5",
                                    "\u0301", "\u3000", "\u00df", "\u216b", "\u0663", "A", "?", "\r", "(", ")", "|", ",",
                                    "Z", "/", "\u0964"]) for _ in range(300)))
N_MERGES = 1600
MAX_TOKEN = 6


def byte_chars():
    """GPT-2's byte alphabet: the character each byte stands for."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def apply_merge(seqs, pair):
    joined = pair[0] + pair[1]
    for i, s in enumerate(seqs):
        out, j = [], 0
        while j < len(s):
            if j + 1 < len(s) and (s[j], s[j + 1]) == pair:
                out.append(joined)
                j += 2
            else:
                out.append(s[j])
                j += 1
        seqs[i] = out


def learn_merges(texts):
    """First every adjacent pair of bytes in the texts (most frequent first), so that a cut between
    any two characters shows; then plain BPE training on the whole texts, the most frequent pair
    (first seen on ties) each step, up to N_MERGES merges and tokens of at most MAX_TOKEN characters."""
    alphabet = byte_chars()
    seqs = [[alphabet[b] for b in t.encode("utf-8")] for t in texts]
    tokens, merges, known = list(alphabet), [], set(alphabet)

    def add(pair):
        merges.append(pair[0] + " " + pair[1])
        if pair[0] + pair[1] not in known:
            known.add(pair[0] + pair[1])
            tokens.append(pair[0] + pair[1])

    counts, first = {}, {}
    for s in seqs:
        for pair in zip(s, s[1:]):
            counts[pair] = counts.get(pair, 0) + 1
            first.setdefault(pair, len(first))
    for pair in sorted(counts, key=lambda p: (-counts[p], first[p])):
        add(pair)
    # Encode with those merges (lowest rank first), then go on from there.
    rank = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
    for i, s in enumerate(seqs):
        while len(s) > 1:
            r, j = min((rank.get((s[k], s[k + 1]), 1 << 30), k) for k in range(len(s) - 1))
            if r == 1 << 30:
                break
            s = s[:j] + [s[j] + s[j + 1]] + s[j + 2:]
        seqs[i] = s
    while len(merges) < N_MERGES:
        counts, first = {}, {}
        for s in seqs:
            for pair in zip(s, s[1:]):
                if len(pair[0]) + len(pair[1]) <= MAX_TOKEN:
                    counts[pair] = counts.get(pair, 0) + 1
                    first.setdefault(pair, len(first))
        if not counts:
            break
        best = max(counts, key=lambda p: (counts[p], -first[p]))
        add(best)
        apply_merge(seqs, best)
    return tokens, merges


def write_vocab(path, pre, tokens, merges, add_bos_key):
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_bos_token_id(len(tokens) - 1)
    if add_bos_key:
        w.add_add_bos_token(False)
    finish_gguf(w)


def main():
    tokens, merges = learn_merges(TEXTS)
    tokens.append("<|bos|>")
    expected = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRES:
            path = os.path.join(tmp, pre + ".gguf")
            write_vocab(path, pre, tokens, merges, True)
            llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
            ids = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) for t in TEXTS]
            write_vocab(path, pre, tokens, merges, False)
            llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
            with_bos = llm.tokenize(b"x", add_bos=True, special=False)
            expected[pre] = {"add_bos_default": with_bos[0] == len(tokens) - 1, "ids": ids}
    out = {"generator": "tests/data/gguf_pretok/gen_gguf_pretok.py", "llama_cpp_python": llama_cpp.__version__,
           "tokens": tokens, "merges": merges, "bos_id": len(tokens) - 1, "texts": TEXTS, "expected": expected}
    path = os.path.join(HERE, "expected.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {len(tokens)} tokens, {len(merges)} merges, {len(PRES)} pre-tokenizers x {len(TEXTS)} texts")


if __name__ == "__main__":
    main()
