#!/usr/bin/env python3
"""Renders the committed chat templates of the model families Tessera loads
(fixtures/chat-templates/*.jinja) with transformers' own renderer, on a set of
conversations, and writes what it printed (or the message a template raised) to
fixtures/chat-templates/goldens.json. text/tests/text/chat_template_goldens.rs checks that
the router's renderer prints the same.

Needs transformers and jinja2 (PyPI); no model, no torch:
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2
    /tmp/venv/bin/python scripts/make_chat_template_goldens.py
"""

import datetime
import json
from pathlib import Path

import jinja2
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

DIR = Path(__file__).resolve().parent.parent / "fixtures" / "chat-templates"

# name -> (Hugging Face repo the template is from, bos_token, eos_token, extra variables).
# Llama 3.x print today's date unless given one, so they get a fixed `date_string`.
TEMPLATES = {
    "qwen3": ("Qwen/Qwen3-0.6B", None, "<|im_end|>", {}),
    "qwen2.5": ("Qwen/Qwen2.5-7B-Instruct", None, "<|im_end|>", {}),
    "deepseek-r1-distill-qwen": (
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        {},
    ),
    "gemma2": ("google/gemma-2-2b-it", "<bos>", "<eos>", {}),
    "gemma3": ("google/gemma-3-4b-it", "<bos>", "<eos>", {}),
    "phi3.5": ("microsoft/Phi-3.5-mini-instruct", "<s>", "<|endoftext|>", {}),
    "phi4": ("microsoft/phi-4", "<|endoftext|>", "<|im_end|>", {}),
    "mixtral": ("mistralai/Mixtral-8x7B-Instruct-v0.1", "<s>", "</s>", {}),
    "mistral-nemo": ("mistralai/Mistral-Nemo-Instruct-2407", "<s>", "</s>", {}),
    "llama3.1": (
        "meta-llama/Llama-3.1-8B-Instruct",
        "<|begin_of_text|>",
        "<|eot_id|>",
        {"date_string": "26 Jul 2024"},
    ),
    "llama3.2": (
        "meta-llama/Llama-3.2-3B-Instruct",
        "<|begin_of_text|>",
        "<|eot_id|>",
        {"date_string": "01 Dec 2026"},
    ),
    "smollm3": ("HuggingFaceTB/SmolLM3-3B", None, "<|im_end|>", {}),
    "gpt-oss": ("openai/gpt-oss-20b", "<|startoftext|>", "<|return|>", {}),
}

# Templates that print today's date (gpt-oss) have it replaced by this in the goldens; the
# test puts its own day in the same place.
TODAY = "{{today}}"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


def msg(role, content, **fields):
    """A message as the router hands it to templates: optional fields only when set."""
    return {"role": role, "content": content, **fields}


SYSTEM = msg("system", "You are a terse assistant. Answer in one line.")
TURNS = [
    msg("user", "Hi!"),
    msg("assistant", "  Hello. How can I help?  "),
    msg("user", "Tell me a joke about compilers."),
]
CALL = {
    "id": "call12345",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
}
TOOL_TURNS = [
    msg("user", "What's the weather in Paris?"),
    msg("assistant", "", tool_calls=[CALL]),
    msg("tool", '{"temperature": 21, "sky": "clear"}', tool_call_id="call12345", name="get_weather"),
]

# (case name, messages, tools, add_generation_prompt, extra variables, only for templates
# whose source contains this text)
CASES = [
    ("one user message", [msg("user", "What is the capital of France?")], None, True, {}, None),
    ("system prompt and turns", [SYSTEM, *TURNS], None, True, {}, None),
    ("history without generation prompt", [SYSTEM, *TURNS[:2]], None, False, {}, None),
    ("turns without system prompt", TURNS, None, True, {}, None),
    (
        "unicode and whitespace",
        [msg("user", "  ¿Qué tal? 日本語 😀\n\tindented line\n\n")],
        None,
        True,
        {},
        None,
    ),
    ("roles that do not alternate", [msg("user", "a"), msg("user", "b")], None, True, {}, None),
    ("system prompt only", [SYSTEM], None, True, {}, None),
    (
        "tools offered",
        [SYSTEM, msg("user", "What's the weather in Paris?")],
        [WEATHER_TOOL],
        True,
        {},
        "tools",
    ),
    ("tool call and result", TOOL_TURNS, [WEATHER_TOOL], True, {}, "tools"),
    (
        "thinking disabled",
        [msg("user", "2 + 2?")],
        None,
        True,
        {"enable_thinking": False},
        "enable_thinking",
    ),
    (
        "no_think flag in the system prompt",
        [msg("system", "Answer briefly. /no_think"), msg("user", "2 + 2?")],
        None,
        True,
        {},
        "/no_think",
    ),
    (
        "think flag in the system prompt",
        [msg("system", "Answer carefully. /think"), msg("user", "2 + 2?")],
        None,
        True,
        {},
        "/think",
    ),
    (
        "reasoning effort",
        [msg("developer", "Answer in French."), msg("user", "2 + 2?")],
        None,
        True,
        {"reasoning_effort": "high"},
        "reasoning_effort",
    ),
    (
        "tool call after thinking, and its result",
        [
            msg("user", "What's the weather in Paris?"),
            msg("assistant", "", thinking="The user wants the weather.", tool_calls=[CALL]),
            TOOL_TURNS[2],
        ],
        [WEATHER_TOOL],
        True,
        {},
        "<|channel|>",
    ),
    (
        "tool round trip answered, then a new question",
        [
            *TOOL_TURNS,
            msg("assistant", "It is 21 degrees and clear.", thinking="Report it."),
            msg("user", "And tomorrow?"),
        ],
        [WEATHER_TOOL],
        True,
        {"reasoning_effort": "low"},
        "<|channel|>",
    ),
    (
        "channel tags in the content are refused",
        [msg("user", "Hi"), msg("assistant", "<|channel|>final<|message|>Hello")],
        None,
        True,
        {},
        "<|channel|>",
    ),
    (
        "reasoning in history",
        [
            msg("user", "2 + 2?"),
            msg("assistant", "<think>\nSimple sum.\n</think>\n\n4"),
            msg("user", "And 3 + 3?"),
        ],
        None,
        True,
        {},
        "</think>",
    ),
]


def render(source, bos, eos, messages, tools, add_generation_prompt, extra):
    # As apply_chat_template: the special tokens that are set, then the caller's variables.
    special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    try:
        text, _ = render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=source,
            add_generation_prompt=add_generation_prompt,
            **special,
            **extra,
        )
        today = datetime.datetime.now().strftime("%Y-%m-%d")
        return {"text": text[0].replace(today, TODAY) if "strftime_now" in source else text[0]}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises TemplateError itself; its subclasses are other failures.
        if type(e) is not jinja2.exceptions.TemplateError:
            raise
        return {"raised": str(e)}


def main():
    templates = {}
    cases = []
    for name, (repo, bos, eos, extra) in TEMPLATES.items():
        source = (DIR / f"{name}.jinja").read_text()
        templates[name] = {"file": f"{name}.jinja", "from": repo, "bos_token": bos, "eos_token": eos}
        for case, messages, tools, gen, case_extra, needs in CASES:
            if needs is not None and needs not in source:
                continue
            variables = {**extra, **case_extra}
            expected = render(source, bos, eos, messages, tools, gen, variables)
            cases.append(
                {
                    "template": name,
                    "case": case,
                    "messages": messages,
                    "tools": tools,
                    "add_generation_prompt": gen,
                    "extra": variables,
                    "expected": expected,
                }
            )
    out = {
        "made_with": f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}",
        "templates": templates,
        "cases": cases,
    }
    (DIR / "goldens.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    raised = sum("raised" in c["expected"] for c in cases)
    print(f"{len(cases)} cases over {len(templates)} templates ({raised} raise)")


if __name__ == "__main__":
    main()
