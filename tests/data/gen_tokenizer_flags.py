#!/usr/bin/env python3
"""Generates tests/data/tokenizer_flags_expected.json with the Hugging Face `tokenizers` package.

Each case takes the byte-level BPE tokenizer ../shared/fixtures/bugs/tokenizer_single_word.json,
replaces its normalizer and added tokens, and records the ids `tokenizers` gives for each input
(add_special_tokens=False; the file has no post-processor). The C++ test
(tests/unit/test_tokenizer_flags.cpp) rebuilds each case and compares, so CI needs no Python.

    python3 -m venv /work/venvs/tok && /work/venvs/tok/bin/pip install tokenizers
    /work/venvs/tok/bin/python tests/data/gen_tokenizer_flags.py ../shared
"""
import itertools
import json
import os
import sys

import tokenizers

shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../../shared")
base_path = os.path.join(shared, "fixtures/bugs/tokenizer_single_word.json")
base = json.load(open(base_path, encoding="utf-8"))

# Whitespace inside and outside ASCII, word characters inside and outside ASCII, case.
INPUTS = [
    "gym", "gymnastics", "abcdgym", "a gym b", " gym ", "  gym  ", "x\u00a0gym\u3000y", "\u2003gym\u2028z",
    "\u00e9gym", "gym\u00e9", "_gym", "gym_", "1gym", "gym1", "gym.", "(gym)", "GYM gym", "Gym",
    "<tool>gym<tool>", "  <tool>  ", "a<tool>\u00a0b", "a \u00a0<tool>\t\nb", "gym<tool>gym", "gymgym",
    "\u0434gym", "gym\u0301", "\u4e2dgym\u4e2d", "",
]
NORM_INPUTS = [
    "e\u0301", "Cafe\u0301 au lait", "cafe\u0301", "CAFE\u0301", "A\u030angstr\u00f6m", "\u00c5ngstr\u00f6m", "\ufb01le \u2460 \u00bd", "\u0130stanbul \u03a3\u039f\u03a3",
    "  padded\u00a0 ", "\u1e9b\u0323", "na\u00efve r\u00e9sum\u00e9", "\u212b \u2126", "\uac00\u1100\u1161",
]

NORMALIZERS = {
    "none": None,
    "NFC": {"type": "NFC"},
    "NFD": {"type": "NFD"},
    "NFKC": {"type": "NFKC"},
    "NFKD": {"type": "NFKD"},
    "Lowercase": {"type": "Lowercase"},
    "Strip": {"type": "Strip", "strip_left": True, "strip_right": True},
    "StripLeft": {"type": "Strip", "strip_left": True, "strip_right": False},
    "NFD+StripAccents+Lowercase": {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}]},
    "NFKC+Replace": {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Replace", "pattern": {"String": " "}, "content": "_"}]},
}


def added(content, id_, single_word=False, lstrip=False, rstrip=False, normalized=True, special=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def run(normalizer, added_tokens, inputs):
    j = dict(base)
    j["normalizer"] = normalizer
    j["added_tokens"] = [base["added_tokens"][0]] + added_tokens
    tok = tokenizers.Tokenizer.from_str(json.dumps(j))
    return [tok.encode(s, add_special_tokens=False).ids for s in inputs]


cases = []
# Every combination of the flags of "gym" (512) and of "<tool>" (513), no normalizer and Lowercase.
for norm in ["none", "Lowercase"]:
    for sw, ls, rs, nz, sp in itertools.product([False, True], repeat=5):
        toks = [added("gym", 512, sw, ls, rs, nz, sp), added("<tool>", 513, sw, ls, rs, not nz, sp)]
        cases.append({"normalizer": NORMALIZERS[norm], "added_tokens": toks, "inputs": INPUTS,
                      "expected": run(NORMALIZERS[norm], toks, INPUTS)})
# Each normalizer on text that it changes, with a normalized and a raw added token.
for name, norm in NORMALIZERS.items():
    # Contents that are not vocabulary strings (an added token naming a vocab string with another id
    # is refused by the C++ loader; tokenizers warns and takes the vocab's id).
    toks = [added("caf\u00e9", 512, normalized=True), added("\u00c5ng", 513, normalized=False)]
    cases.append({"normalizer": norm, "added_tokens": toks, "inputs": NORM_INPUTS + INPUTS,
                  "expected": run(norm, toks, NORM_INPUTS + INPUTS)})

out = {"generator": "tests/data/gen_tokenizer_flags.py", "tokenizers_version": tokenizers.__version__,
       "base": "fixtures/bugs/tokenizer_single_word.json", "cases": cases}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer_flags_expected.json")
with open(path, "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
    f.write("\n")
print(f"{path}: {len(cases)} cases, {sum(len(c['inputs']) for c in cases)} encodings")
