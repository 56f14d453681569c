"""Pydantic AI (pydantic-ai-slim[openai]) against /v1/chat/completions.

Checks that `Agent(..., output_type=City)` returns a `City` both through its default tool output
(a forced output tool) and through `NativeOutput(City)` (response_format json_schema), with usage.
No retries: a first answer that does not validate fails the test.
"""

import pytest
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from conftest import API_KEY, BASE_URL, CAPITAL_QUESTION, City

SETTINGS = ModelSettings(temperature=0, max_tokens=128)


@pytest.fixture(scope="module")
def model(model):
    provider = OpenAIProvider(base_url=f"{BASE_URL}/v1", api_key=API_KEY)
    return OpenAIChatModel(model, provider=provider)


@pytest.mark.parametrize("output_type", [City, NativeOutput(City)], ids=["tool", "native"])
def test_output_type(model, output_type):
    agent = Agent(model, output_type=output_type, model_settings=SETTINGS, retries=0)
    result = agent.run_sync(CAPITAL_QUESTION)
    assert isinstance(result.output, City)
    assert result.usage.output_tokens > 0

