"""instructor on the `openai` client against /v1/chat/completions.

Checks that `create(response_model=City)` returns a `City` in `Mode.JSON_SCHEMA`
(response_format json_schema) and in `Mode.TOOLS` (a forced function call), with no retries, so
the first answer must validate.
"""

import instructor
import pytest
from openai import OpenAI

from conftest import API_KEY, BASE_URL, CAPITAL_QUESTION, City


@pytest.mark.parametrize("mode", [instructor.Mode.JSON_SCHEMA, instructor.Mode.TOOLS],
                         ids=["json_schema", "tools"])
def test_response_model(model, mode):
    client = instructor.from_openai(
        OpenAI(base_url=f"{BASE_URL}/v1", api_key=API_KEY, max_retries=0, timeout=60), mode=mode,
    )
    city, completion = client.chat.completions.create_with_completion(
        model=model, response_model=City, max_retries=0, temperature=0, max_tokens=128,
        messages=[{"role": "user", "content": CAPITAL_QUESTION}],
    )
    assert isinstance(city, City)
    assert completion.choices[0].finish_reason in ("stop", "tool_calls")
