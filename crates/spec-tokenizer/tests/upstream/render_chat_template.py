#!/usr/bin/env python3
"""Render a chat template with Python's jinja2, the way transformers' apply_chat_template does
(sandboxed environment, trim_blocks, lstrip_blocks, loop controls, raise_exception), and print the
results as JSON.

Usage:
    render_chat_template.py TEMPLATE.jinja CASES.json BOS_TOKEN EOS_TOKEN

TEMPLATE.jinja holds the template source (the test writes the GGUF's tokenizer.chat_template
there; reading it here with the `gguf` package would take ~30 s for a 150k-token vocabulary).
CASES.json is a list of {"messages": [{"role", "content"}...], "add_generation_prompt": bool}.
Prints a JSON list with one rendered string per case. Needs the `jinja2` package.
"""

import json
import sys


def main() -> int:
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    with open(sys.argv[1], encoding="utf-8") as f:
        source = f.read()
    bos_token, eos_token = sys.argv[3], sys.argv[4]

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)
    with open(sys.argv[2], encoding="utf-8") as f:
        cases = json.load(f)
    out = [
        template.render(
            messages=case["messages"],
            add_generation_prompt=case["add_generation_prompt"],
            bos_token=bos_token,
            eos_token=eos_token,
        )
        for case in cases
    ]
    json.dump(out, sys.stdout, ensure_ascii=False)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
