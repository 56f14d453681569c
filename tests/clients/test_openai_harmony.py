"""The `openai` SDK against gpt-oss's harmony format: a second server of
fixtures/tiny-gpt-oss-harmony (tiny-gpt-oss with gpt-oss's chat template and the harmony tokens;
scripts/agent-clients.sh starts it and exports TESSERA_HARMONY_BASE_URL). Its weights are random,
so what is checked is the protocol: a named tool choice gives exactly one call whose arguments
validate, whole and streamed; reasoning comes back as `reasoning_content`, never in `content`;
`chat.completions.parse` fills a Pydantic model from the final channel; a tool round trip
renders; the Responses API returns the call as a `function_call` item.
"""

import json
import os

import pytest
from openai import OpenAI
from pydantic import BaseModel

from conftest import check_arguments

BASE_URL = os.environ.get("TESSERA_HARMONY_BASE_URL", "http://127.0.0.1:3002")
MODEL = "tiny-gpt-oss-harmony"
MARKERS = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|call|>", "<|return|>")

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"enum": ["Oslo", "Lima"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                             "parameters": PARAMETERS}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
QUESTION = [{"role": "user", "content": "Weather in Oslo?"}]


class Answer(BaseModel):
    value: int


@pytest.fixture(scope="module")
def client():
    return OpenAI(base_url=f"{BASE_URL}/v1", api_key="dummy", max_retries=0, timeout=60)


def assert_clean(*texts):
    for text in texts:
        assert not any(m in (text or "") for m in MARKERS), text


def test_named_tool_choice_gives_one_call_that_validates(client):
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER],
                                           tool_choice=NAMED, max_tokens=128, temperature=1.0,
                                           seed=seed)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.function.name == "get_weather"
        check_arguments(call.function.arguments, PARAMETERS)
        assert_clean(choice.message.content)


def test_a_streamed_call_is_the_whole_one(client):
    args = dict(model=MODEL, messages=QUESTION, tools=[WEATHER], tool_choice=NAMED,
                max_tokens=128, temperature=0)
    whole = client.chat.completions.create(**args).choices[0].message.tool_calls[0]
    name, arguments, finish = None, "", None
    for chunk in client.chat.completions.create(**args, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for call in delta.tool_calls or []:
            assert call.index == 0
            name = call.function.name or name
            arguments += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, arguments, finish) == (whole.function.name, whole.function.arguments,
                                         "tool_calls")


def test_reasoning_comes_back_apart_from_the_content(client):
    reasoned = []
    for seed in range(4):
        args = dict(model=MODEL, messages=QUESTION, tools=[WEATHER], max_tokens=40,
                    temperature=1.0, seed=seed, reasoning_effort="low")
        message = client.chat.completions.create(**args).choices[0].message
        reasoning = (message.model_extra or {}).get("reasoning_content")
        assert_clean(message.content, reasoning)
        streamed = ""
        for chunk in client.chat.completions.create(**args, stream=True):
            if chunk.choices:
                streamed += (chunk.choices[0].delta.model_extra or {}).get(
                    "reasoning_content") or ""
        assert streamed == (reasoning or "")
        reasoned.append(bool(reasoning))
    assert any(reasoned)


def test_parse_fills_a_model_from_the_final_channel(client):
    r = client.chat.completions.parse(model=MODEL, messages=QUESTION, response_format=Answer,
                                      max_tokens=64, temperature=0)
    message = r.choices[0].message
    assert isinstance(message.parsed, Answer)
    assert json.loads(message.content) == message.parsed.model_dump()


def test_a_tool_round_trip_is_answered(client):
    first = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=[WEATHER],
                                           tool_choice=NAMED, max_tokens=128, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    messages = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 3}'},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                       max_tokens=16, temperature=0)
    assert r.usage.prompt_tokens > first.usage.prompt_tokens
    assert_clean(r.choices[0].message.content)


def test_responses_return_the_call_as_an_item(client):
    tool = {"type": "function", "name": "get_weather", "parameters": PARAMETERS}
    r = client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[tool],
                                tool_choice={"type": "function", "name": "get_weather"},
                                max_output_tokens=128, temperature=0,
                                reasoning={"effort": "low"})
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    check_arguments(calls[0].arguments, PARAMETERS)
