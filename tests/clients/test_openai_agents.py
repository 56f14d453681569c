"""The OpenAI Agents SDK (openai-agents) against /v1/chat/completions and /v1/responses.

Checks that an agent with a function tool runs to completion through the Chat Completions model
(the tool is called with a valid argument, its result goes back, the run ends within a few
turns), that `output_type` yields a model instance, and that the Responses model completes a
plain text run with usage. Tracing, which would export to OpenAI, is disabled.
"""

import asyncio

from agents import (
    Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
    function_tool, set_tracing_disabled,
)
from openai import AsyncOpenAI

from conftest import API_KEY, BASE_URL, CAPITAL_QUESTION, MODEL, City

set_tracing_disabled(True)
calls = []


@function_tool
def get_weather(city: str) -> str:
    """Current weather of a city."""
    calls.append(city)
    return f"It is 18 degrees and sunny in {city}."


def run(prompt, max_turns, responses=False, **agent):
    """Runner.run on a fresh client, closed within the event loop that used it."""
    async def go():
        async with AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key=API_KEY, max_retries=0,
                               timeout=60) as client:
            kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
            model = kind(model=MODEL, openai_client=client)
            return await Runner.run(Agent(name="test", model=model, **agent), prompt,
                                    max_turns=max_turns)
    calls.clear()
    return asyncio.run(go())


def test_tool_stops_on_first_call():
    result = run(
        "What is the weather in Paris?", max_turns=2, tools=[get_weather],
        tool_use_behavior="stop_on_first_tool",
        model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=96),
    )
    assert len(calls) == 1 and isinstance(calls[0], str)
    assert result.final_output == f"It is 18 degrees and sunny in {calls[0]}."


def test_tool_round_trip_completes():
    """A forced call, its result sent back, then (tool choice reset to auto) a text answer."""
    result = run(
        "What is the weather in Paris?", max_turns=3, tools=[get_weather],
        instructions="Answer with the weather tool.",
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=96),
    )
    assert calls and result.context_wrapper.usage.requests >= 2
    assert isinstance(result.final_output, str) and result.final_output


def test_output_type():
    result = run(CAPITAL_QUESTION, max_turns=1, output_type=City,
                 model_settings=ModelSettings(temperature=0, max_tokens=128))
    assert isinstance(result.final_output, City)


def test_responses_model_text_run():
    result = run(
        "Reply with one word: hello.", max_turns=1, responses=True,
        instructions="Answer briefly.",
        model_settings=ModelSettings(temperature=0, max_tokens=64),
    )
    assert isinstance(result.final_output, str) and result.final_output
    usage = result.context_wrapper.usage
    assert usage.requests == 1 and usage.output_tokens > 0
