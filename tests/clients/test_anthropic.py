"""The `anthropic` SDK against the Anthropic Messages API (/v1/messages, /v1/messages/count_tokens).

Checks, per Anthropic's documented protocol: a text message with a documented stop_reason and
usage; a stream whose events come in order (message_start, then per content block start, deltas
and stop with matching indices, then message_delta with the stop_reason, then message_stop;
pings anywhere) and whose final message has usage; a forced tool (`tool_choice` type `tool`)
giving one `tool_use` block whose input validates, streamed too, and a `tool_result` sent back
getting a reply; token counting. Marked `anthropic` (`-m anthropic` / `-m "not anthropic"`).
"""

import jsonschema
import pytest
from anthropic import Anthropic

from conftest import BASE_URL, assert_no_tool_markup

pytestmark = pytest.mark.anthropic

STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence"}
WEATHER_SCHEMA = {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
}
WEATHER_TOOL = {"name": "get_weather", "description": "Current weather of a city.",
                "input_schema": WEATHER_SCHEMA}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = {"type": "tool", "name": "get_weather"}
RAW_EVENTS = {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
              "message_delta", "message_stop"}


@pytest.fixture(scope="module")
def client():
    return Anthropic(base_url=BASE_URL, api_key="dummy", max_retries=0, timeout=60)


def test_create_text(client, model):
    message = client.messages.create(
        model=model, max_tokens=32, system="Answer briefly.",
        messages=[{"role": "user", "content": "Say hello."}], stop_sequences=["\n\n"],
    )
    assert message.type == "message" and message.role == "assistant" and message.id
    assert message.content and all(block.type == "text" for block in message.content)
    assert message.stop_reason in STOP_REASONS
    if message.stop_reason == "stop_sequence":
        assert message.stop_sequence == "\n\n"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_max_tokens_stop_reason(client, model):
    message = client.messages.create(
        model=model, max_tokens=1, messages=[{"role": "user", "content": "Tell me a long story."}],
    )
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 1


def check_event_order(events):
    """message_start (block_start delta* block_stop)* message_delta message_stop, pings anywhere."""
    types = [e.type for e in events if e.type in RAW_EVENTS]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"], types
    open_index, next_index = None, 0
    block_events = {"content_block_start", "content_block_delta", "content_block_stop"}
    for event in (e for e in events if e.type in block_events):
        if event.type == "content_block_start":
            assert open_index is None and event.index == next_index, types
            open_index = event.index
        else:
            assert event.index == open_index, types
            if event.type == "content_block_stop":
                open_index, next_index = None, next_index + 1
    assert open_index is None and next_index >= 1, types
    assert types.count("message_start") == 1 and types.count("message_delta") == 1
    delta = next(e for e in events if e.type == "message_delta")
    return delta


def test_stream_event_order(client, model):
    with client.messages.stream(
        model=model, max_tokens=32, messages=[{"role": "user", "content": "Say hello."}]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    delta = check_event_order(events)
    assert delta.delta.stop_reason in STOP_REASONS
    assert final.stop_reason == delta.delta.stop_reason
    assert final.content and final.content[0].type == "text" and final.content[0].text
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0


def tool_use_blocks(message):
    assert_no_tool_markup("".join(b.text for b in message.content if b.type == "text"))
    blocks = [b for b in message.content if b.type == "tool_use"]
    assert len(blocks) == 1, message.content
    block = blocks[0]
    assert block.id and block.name == "get_weather" and isinstance(block.input, dict)
    jsonschema.validate(block.input, WEATHER_SCHEMA)
    return block


def test_tool_round_trip(client, model):
    first = client.messages.create(
        model=model, max_tokens=96, messages=QUESTION, tools=[WEATHER_TOOL],
        tool_choice=FORCED,
    )
    assert first.stop_reason == "tool_use"
    block = tool_use_blocks(first)
    messages = QUESTION + [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": block.id, "content": "18 degrees, sunny"},
        ]},
    ]
    second = client.messages.create(
        model=model, max_tokens=48, messages=messages, tools=[WEATHER_TOOL],
        tool_choice={"type": "none"},
    )
    assert second.stop_reason in STOP_REASONS
    assert second.content and second.content[0].type == "text" and second.content[0].text


def test_streamed_tool_use(client, model):
    with client.messages.stream(
        model=model, max_tokens=96, messages=QUESTION, tools=[WEATHER_TOOL],
        tool_choice=FORCED,
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    delta = check_event_order(events)
    assert delta.delta.stop_reason == "tool_use"
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == ["tool_use"] and starts[0].name == "get_weather"
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert deltas and all(d.type == "input_json_delta" for d in deltas)
    assert tool_use_blocks(final).id == starts[0].id


def test_count_tokens(client, model):
    count = client.messages.count_tokens(model=model, messages=QUESTION, tools=[WEATHER_TOOL])
    assert isinstance(count.input_tokens, int) and count.input_tokens > 0
