"""Shared fixtures for the agent-client protocol tests.

scripts/agent-clients.sh starts one server for the whole session and exports its address:
TESSERA_BASE_URL (no /v1), TESSERA_MODEL, OPENAI_BASE_URL and OPENAI_API_KEY. The helpers here
check the protocol only; the model (SmolLM2-135M) is far too small to judge its answers.
"""

import json
import os

import jsonschema
import pytest
from pydantic import BaseModel

# Also when pytest runs without the script: no traces to OpenAI, LangSmith or Logfire.
for name, value in [("OPENAI_AGENTS_DISABLE_TRACING", "1"), ("LANGCHAIN_TRACING_V2", "false"),
                    ("LANGSMITH_TRACING", "false"), ("LOGFIRE_SEND_TO_LOGFIRE", "false")]:
    os.environ.setdefault(name, value)

BASE_URL = os.environ.get("TESSERA_BASE_URL", "http://127.0.0.1:3000")
MODEL = os.environ.get("TESSERA_MODEL", "SmolLM2-135M-Instruct")
API_KEY = os.environ.get("OPENAI_API_KEY", "dummy")
TOOL_CALL_TAG = "<tool_call>"

# A tool whose parameters say nothing about additionalProperties: only declared keys may appear.
VERDICT_PARAMETERS = {
    "type": "object",
    "properties": {"guilty": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["guilty", "reason"],
}
VERDICT_TOOL = {
    "type": "function",
    "function": {
        "name": "Verdict",
        "description": "Record the court's verdict.",
        "parameters": VERDICT_PARAMETERS,
    },
}
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": WEATHER_PARAMETERS,
    },
}

CAPITAL_QUESTION = "Which city is the capital of France?"


class City(BaseModel):
    """The structured output all clients ask for, as plain as users write it (no length bounds:
    the server must get a small model to close its strings)."""

    name: str
    country: str


def pytest_configure(config):
    config.addinivalue_line("markers", "anthropic: needs the Anthropic Messages API (/v1/messages)")


@pytest.fixture(scope="session")
def model():
    return MODEL


@pytest.fixture(scope="session")
def base_url():
    return BASE_URL


def check_arguments(arguments, schema):
    """Tool-call arguments (a JSON string or a dict): an object that validates against schema."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert isinstance(args, dict), f"arguments are not an object: {arguments!r}"
    jsonschema.validate(args, schema)
    return args


def assert_no_tool_markup(content):
    """No call markup in text, nor a prefix of it left at the end by a cut."""
    content = content or ""
    assert TOOL_CALL_TAG[:-1] not in content, f"tool-call markup in content: {content!r}"
    for n in range(1, len(TOOL_CALL_TAG)):
        prefix = TOOL_CALL_TAG[:n]
        assert not content.endswith(prefix), f"content ends in {prefix!r}: {content!r}"
