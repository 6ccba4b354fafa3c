#!/usr/bin/env python3
"""Renders a checkpoint's chat template with Python's jinja2 exactly as Hugging Face's
apply_chat_template does (transformers' _compile_jinja_template and render), the reference that
pdserve's own template engine is compared with byte for byte (tests/chat_template_golden.cc).

  render_chat_template.py TOKENIZER_CONFIG_JSON CASES_JSON
  render_chat_template.py --templates CASES_JSON

CASES_JSON is a list of {"name", "messages", "tools"?, "add_generation_prompt"?,
"chat_template_kwargs"?}; with --templates, {"context": {...}, "templates": [...]}, each template
rendered over the context. Prints a JSON list with, per case, {"text": ...} or {"error": ...}.
Exits 77 when jinja2 is not installed (Debian: python3-jinja2).
"""
import datetime
import json
import sys

try:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("jinja2 is not installed (Debian: python3-jinja2)", file=sys.stderr)
    sys.exit(77)

SPECIAL_TOKEN_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                      "cls_token", "mask_token"]


class TemplateRaised(Exception):
    pass


def raise_exception(message):
    raise TemplateRaised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers overrides jinja's tojson (which escapes HTML and sorts keys).
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def token_text(value):
    if isinstance(value, dict):
        return value.get("content")
    return value


def special_tokens(config):
    """transformers' special_tokens_map: the configured special tokens, None ones left out."""
    tokens = {}
    for key in SPECIAL_TOKEN_KEYS:
        text = token_text(config.get(key))
        if isinstance(text, str):
            tokens[key] = text
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        tokens["additional_special_tokens"] = [t for t in map(token_text, extra)
                                               if isinstance(t, str)]
    return tokens


def template_text(config):
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t["name"]: t["template"] for t in template}
        return named.get("default", template[0]["template"])
    return template


def hf_environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_templates(path):
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)
    env = hf_environment()
    results = []
    for text in cases["templates"]:
        try:
            results.append({"text": env.from_string(text).render(**cases["context"])})
        except Exception as e:
            results.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout, ensure_ascii=False)


def main():
    if sys.argv[1] == "--templates":
        render_templates(sys.argv[2])
        return
    with open(sys.argv[1], encoding="utf-8") as f:
        config = json.load(f)
    with open(sys.argv[2], encoding="utf-8") as f:
        cases = json.load(f)
    env = hf_environment()
    template = env.from_string(template_text(config))
    tokens = special_tokens(config)
    results = []
    for case in cases:
        kwargs = {**tokens, **case.get("chat_template_kwargs", {})}
        try:
            text = template.render(messages=case["messages"], tools=case.get("tools"),
                                   documents=None,
                                   add_generation_prompt=case.get("add_generation_prompt", True),
                                   **kwargs)
            results.append({"text": text})
        except Exception as e:  # the template raised or failed: pdserve must fail too
            results.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
