"""Does SmolLM2-135M-Instruct write a Hermes tool call (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``)
for a small arithmetic question when the calculator tool is described to it? (docs/agents.md, "SmolLM2 probe")

Its chat template ignores ``tools=``, so each variant puts a Hermes-style tool description in the system turn
(as Qwen2.5's template writes it). Samples ``--samples`` answers per variant with transformers (temperature 1 and
greedy) and counts the answers that contain a ``<tool_call>`` block, and those that parse as a call of
``calculator`` (``easyrl.agents.parsers.hermes``).

    python bench/smollm2_tool_probe.py [--samples 16] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from easyrl.agents.parsers import hermes
from easyrl.agents.tools import load_tools
from easyrl.testing.smollm2 import smollm2_path

QUESTION = "What is 123 * 45? Use the calculator."


def system_prompt(schema: dict, example: bool) -> str:
    text = ("You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
            "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{json.dumps(schema)}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
            "\"arguments\": <args-json-object>}\n</tool_call>")
    if example:
        text += ('\n\nExample: to compute 2 + 2 answer exactly\n<tool_call>\n{"name": "calculator", "arguments": '
                 '{"expression": "2 + 2"}}\n</tool_call>')
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    schema = load_tools(["examples/agents/tools.py:calculator"])["calculator"].schema
    variants = {
        "tools in system": [{"role": "system", "content": system_prompt(schema, False)},
                            {"role": "user", "content": QUESTION}],
        "tools + example": [{"role": "system", "content": system_prompt(schema, True)},
                            {"role": "user", "content": QUESTION}],
    }
    for name, messages in variants.items():
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, return_tensors="pt").input_ids
        for label, kwargs in (("greedy", {"do_sample": False}), ("T=1", {"do_sample": True, "temperature": 1.0})):
            count = 1 if label == "greedy" else args.samples
            with torch.no_grad():
                out = model.generate(ids.repeat(count, 1), attention_mask=torch.ones_like(ids).repeat(count, 1),
                                     max_new_tokens=args.max_new_tokens,
                                     pad_token_id=tokenizer.eos_token_id, **kwargs)
            answers = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
            tagged = sum("<tool_call>" in a for a in answers)
            valid = sum(any(c.get("name") == "calculator" for c in hermes(a)) for a in answers)
            print(f"{name:16s} {label:6s}: {tagged}/{count} with <tool_call>, {valid}/{count} valid calculator calls;"
                  f" first: {answers[0][:120]!r}")


if __name__ == "__main__":
    main()
