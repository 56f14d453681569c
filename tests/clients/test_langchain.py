"""LangChain's `ChatOpenAI` (langchain-openai) against /v1/chat/completions.

Checks that `bind_tools` with a forced tool yields one well-formed `AIMessage.tool_calls` entry
whose args validate against the tool's schema, that `with_structured_output` returns a model
instance by json_schema and by function calling, and that `.stream()` yields chunks and ends
with a finish reason and usage.
"""

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from conftest import API_KEY, BASE_URL, CAPITAL_QUESTION, City, check_arguments


class get_weather(BaseModel):
    """Current weather of a city."""

    city: str = Field(description="the city's name")


@pytest.fixture(scope="module")
def llm(model):
    return ChatOpenAI(
        model=model, base_url=f"{BASE_URL}/v1", api_key=API_KEY, temperature=0, max_tokens=96,
        max_retries=0, timeout=60, stream_usage=True,
    )


def test_bind_tools_forced_tool(llm):
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(
        "What is the weather in Paris?"
    )
    assert not message.invalid_tool_calls
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call["name"] == "get_weather" and call["id"] and call["type"] == "tool_call"
    check_arguments(call["args"], get_weather.model_json_schema())
    assert message.response_metadata["finish_reason"] in ("tool_calls", "stop")


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output(llm, method):
    structured = llm.with_structured_output(City, method=method, include_raw=True)
    result = structured.invoke(CAPITAL_QUESTION)
    assert result["parsing_error"] is None
    assert isinstance(result["parsed"], City)


def test_stream_yields_chunks_and_ends(llm):
    chunks = list(llm.stream("Say hello in three words."))
    assert chunks and all(isinstance(c, AIMessageChunk) for c in chunks)
    message = sum(chunks[1:], chunks[0])
    assert message.content
    assert message.response_metadata.get("finish_reason") in ("stop", "length")
    assert message.usage_metadata and message.usage_metadata["output_tokens"] > 0
