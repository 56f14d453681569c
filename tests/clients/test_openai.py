"""The `openai` SDK against /v1/chat/completions.

Checks structured output (`chat.completions.parse` with a Pydantic model, strict json_schema),
streaming (every stream ends with a finish_reason and reports usage), and tool calls: a named
tool_choice gives exactly one well-formed call, `required` at least one, arguments parse and
validate against the tool's schema and carry only its declared keys, and no `<tool_call` markup
leaks into content, not even when max_tokens cuts a call short.
"""

import functools
import json

import jsonschema
import pytest
from openai import OpenAI

from conftest import (
    API_KEY, BASE_URL, CAPITAL_QUESTION, VERDICT_PARAMETERS, VERDICT_TOOL, WEATHER_PARAMETERS,
    WEATHER_TOOL, City, assert_no_tool_markup, check_arguments,
)

COURT = [{"role": "user", "content": "Is the defendant guilty of stealing a cookie?"}]
WEATHER = [{"role": "user", "content": "What is the weather in Paris? Call the tool."}]


@pytest.fixture(scope="module")
def client():
    return OpenAI(base_url=f"{BASE_URL}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def chat(client, model):
    """chat.completions.create, greedy so that a failure reproduces."""
    return functools.partial(client.chat.completions.create, model=model, temperature=0)


def test_parse_pydantic_model(client, model):
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": CAPITAL_QUESTION}],
        response_format=City,
        temperature=0,
        max_tokens=128,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)
    assert completion.usage.completion_tokens > 0


STRICT_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "year", "tags"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("prompt", [
    "Describe a famous novel.",
    "Tell me about a film from the nineties, with a long title.",
    "Give a song with many tags.",
])
def test_strict_json_schema_stop_parses(chat, prompt):
    completion = chat(
        messages=[{"role": "user", "content": prompt}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "Work", "schema": STRICT_SCHEMA, "strict": True},
        },
        max_tokens=128,
    )
    choice = completion.choices[0]
    assert choice.finish_reason in ("stop", "length")
    if choice.finish_reason == "stop":
        jsonschema.validate(json.loads(choice.message.content), STRICT_SCHEMA)


def test_stream_ends_with_finish_reason_and_usage(chat):
    stream = chat(
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [f for f in finishes if f] in (["stop"], ["length"]) and finishes[-1]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text


def test_named_tool_choice_gives_exactly_one_call(chat):
    completion = chat(
        messages=COURT,
        tools=[VERDICT_TOOL, WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "Verdict"}},
        max_tokens=128,
    )
    choice = completion.choices[0]
    calls = choice.message.tool_calls or []
    assert len(calls) == 1, f"{len(calls)} calls, finish_reason {choice.finish_reason}"
    assert calls[0].type == "function" and calls[0].id
    assert calls[0].function.name == "Verdict"
    check_arguments(calls[0].function.arguments, VERDICT_PARAMETERS)
    assert_no_tool_markup(choice.message.content)
    assert choice.finish_reason in ("tool_calls", "stop")


def test_required_tool_choice_gives_calls(chat):
    completion = chat(
        messages=WEATHER, tools=[WEATHER_TOOL, VERDICT_TOOL],
        tool_choice="required", max_tokens=128,
    )
    choice = completion.choices[0]
    assert choice.finish_reason != "length"
    assert choice.message.tool_calls
    schemas = {"get_weather": WEATHER_PARAMETERS, "Verdict": VERDICT_PARAMETERS}
    for call in choice.message.tool_calls:
        check_arguments(call.function.arguments, schemas[call.function.name])
    assert_no_tool_markup(choice.message.content)


def test_streamed_named_tool_call(chat):
    stream = chat(
        messages=WEATHER, tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64, stream=True,
    )
    calls, finish = {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or delta.id
            call["name"] = call["name"] or (delta.function and delta.function.name)
            call["arguments"] += (delta.function and delta.function.arguments) or ""
    assert finish in ("tool_calls", "stop")
    assert len(calls) == 1, f"{len(calls)} calls"
    call = calls[0]
    assert call["id"] and call["name"] == "get_weather"
    check_arguments(call["arguments"], WEATHER_PARAMETERS)


def test_arguments_carry_only_declared_keys(chat):
    """Parameters without additionalProperties: vLLM and OpenAI give only declared keys."""
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = {"type": "function", "function": {"name": "lookup", "parameters": parameters}}
    messages = [{"role": "user", "content": "Look up Paris: population, area, mayor, country."}]
    for tool_choice in ("required", {"type": "function", "function": {"name": "lookup"}}):
        completion = chat(messages=messages, tools=[tool], tool_choice=tool_choice, max_tokens=96)
        assert completion.choices[0].message.tool_calls, tool_choice
        for call in completion.choices[0].message.tool_calls:
            args = check_arguments(call.function.arguments, parameters)
            assert set(args) <= {"city"}, f"undeclared keys: {call.function.arguments}"


# Greedy SmolLM2 opens this answer with a call even under tool_choice "auto".
CALL_PROMPT = [{"role": "user", "content": "Respond with a <tool_call> only: weather in Paris."}]


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8, 13, 21, 27])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_cut_tool_call_leaves_no_markup(chat, max_tokens, tool_choice):
    completion = chat(
        messages=CALL_PROMPT, tools=[WEATHER_TOOL], tool_choice=tool_choice, max_tokens=max_tokens,
    )
    choice = completion.choices[0]
    assert_no_tool_markup(choice.message.content)
    for call in choice.message.tool_calls or []:
        check_arguments(call.function.arguments, WEATHER_PARAMETERS)


@pytest.mark.parametrize("max_tokens", [5, 21])
def test_cut_streamed_tool_call_leaves_no_markup(chat, max_tokens):
    stream = chat(messages=CALL_PROMPT, tools=[WEATHER_TOOL], max_tokens=max_tokens, stream=True)
    chunks = [c for c in stream if c.choices]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert_no_tool_markup("".join(c.choices[0].delta.content or "" for c in chunks))


def test_tool_result_round_trip(chat):
    first = chat(
        messages=WEATHER, tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=64,
    )
    call = first.choices[0].message.tool_calls[0]
    messages = WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18}'},
    ]
    second = chat(messages=messages, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=32)
    choice = second.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.content and not choice.message.tool_calls
    assert_no_tool_markup(choice.message.content)


@pytest.mark.skip(reason="SmolLM2 has no reasoning; needs a model served with --reasoning-parser")
def test_reasoning_content_separate(chat):
    completion = chat(messages=[{"role": "user", "content": "Think, then say hi."}], max_tokens=64)
    message = completion.choices[0].message
    reasoning = getattr(message, "reasoning_content", None) or getattr(message, "reasoning", None)
    assert reasoning and "<think>" not in (message.content or "")
