"""The `openai` SDK's `embeddings.create` against /v1/embeddings.

The server is the tiny embedding fixture (scripts/agent-clients.sh starts it beside SmolLM2 and
exports TESSERA_EMBEDDING_BASE_URL), whose sentence-transformers vectors are in the repository:
the SDK's default (base64, which it decodes), `encoding_format="float"` and `"base64"` (decoded
here) give them, for
one text and for a batch, in order, with usage; `dimensions` cuts and renormalises; a bad
request raises the SDK's BadRequestError.
"""

import base64
import json
import math
import os
import struct
from pathlib import Path

import openai
import pytest
from openai import OpenAI

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-qwen3-embedding"
BASE_URL = os.environ.get("TESSERA_EMBEDDING_BASE_URL", "http://127.0.0.1:3001")
MODEL = "tiny-qwen3-embedding"


@pytest.fixture(scope="module")
def client():
    return OpenAI(base_url=f"{BASE_URL}/v1", api_key="dummy", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def golden():
    inputs = json.loads((FIXTURE / "golden_embeddings.json").read_text())["inputs"]
    return [(i["text"], i["embedding"], len(i["ids"])) for i in inputs]


def assert_close(got, want):
    assert len(got) == len(want)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4
    dot = sum(a * b for a, b in zip(got, want))
    norm = math.sqrt(sum(a * a for a in got)) * math.sqrt(sum(b * b for b in want))
    assert dot / norm >= 0.99999


@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_batch_matches_sentence_transformers(client, golden, encoding_format):
    texts = [text for text, _, _ in golden[:32]]
    extra = {} if encoding_format is None else {"encoding_format": encoding_format}
    response = client.embeddings.create(model=MODEL, input=texts, **extra)
    assert response.object == "list"
    assert [d.index for d in response.data] == list(range(len(texts)))
    for d, (_, want, _) in zip(response.data, golden):
        assert d.object == "embedding"
        vector = d.embedding
        if encoding_format == "base64":
            # Asked for explicitly, the SDK hands the string over as sent.
            raw = base64.b64decode(vector)
            vector = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        assert_close(vector, want)
    tokens = sum(n for _, _, n in golden[:32])
    assert response.usage.prompt_tokens == tokens
    assert response.usage.total_tokens == tokens


def test_one_text_and_dimensions(client, golden):
    text, want, _ = golden[3]
    one = client.embeddings.create(model=MODEL, input=text)
    assert len(one.data) == 1
    assert_close(one.data[0].embedding, want)
    cut = client.embeddings.create(model=MODEL, input=text, dimensions=16)
    norm = math.sqrt(sum(x * x for x in want[:16]))
    assert_close(cut.data[0].embedding, [x / norm for x in want[:16]])


def test_bad_request_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=MODEL, input="hello", dimensions=100000)
    assert "dimensions" in str(raised.value)
