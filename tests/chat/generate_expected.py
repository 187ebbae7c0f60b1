#!/usr/bin/env python3
"""Renders every template in templates/ with every case of cases.json the way Hugging Face's
apply_chat_template does (jinja2 ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
raise_exception, strftime_now, loopcontrols) and writes expected.json, which
tests/unit/test_chat_template.cpp compares minja's output with. CI needs no Python: the output is
committed. Regenerate after changing a template or a case:

    python3 -m venv /work/venvs/jinja && /work/venvs/jinja/bin/pip install jinja2
    /work/venvs/jinja/bin/python tests/chat/generate_expected.py
"""
import json
import pathlib
from datetime import datetime, timezone

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

here = pathlib.Path(__file__).parent
spec = json.loads((here / "cases.json").read_text(encoding="utf-8"))


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):  # a fixed time, in UTC (the C++ test sets TZ=UTC)
    return datetime.fromtimestamp(spec["now"], timezone.utc).strftime(fmt)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
# transformers' apply_chat_template replaces jinja2's tojson (which sorts keys and escapes HTML) with
# json.dumps keeping the keys' order
env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
    x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

out = {"jinja2_version": jinja2.__version__, "templates": {}}
for path in sorted((here / "templates").glob("*.jinja")):
    template = env.from_string(path.read_text(encoding="utf-8"))
    results = {}
    for case in spec["cases"]:
        try:
            extra = {"tools": case["tools"]} if "tools" in case else {}  # undefined unless the case has tools
            text = template.render(messages=case["messages"], add_generation_prompt=case["add_generation_prompt"],
                                   bos_token=spec["bos_token"], eos_token=spec["eos_token"], **extra)
            results[case["name"]] = {"text": text}
        except jinja2.exceptions.TemplateError as e:
            results[case["name"]] = {"error": str(e)}
    out["templates"][path.name] = results
(here / "expected.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
print(f"wrote {here / 'expected.json'}")
