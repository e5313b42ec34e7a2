"""The OpenAI-compatible provider, driven through the real ``openai`` client against a real loopback server."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from yak_loopback.openai_replies import Reply, fake_embedding
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.llm import (
    LLMOutputError,
    LLMProvider,
    LLMRequestRejected,
    LLMUnavailable,
    OpenAIChatProvider,
    RulesProvider,
    get_llm_provider,
    prompts,
)
from yak_pipeline.llm.models import DistillationOutput, ScoreOutput, response_schema
from yak_pipeline.llm.openai_client import RETRY_TEMPERATURE
from yak_pipeline.settings import Settings

EXCHANGE = "User: I live in Berlin and I'm a nurse.\nAssistant: Nice to meet you!"
GOOD = {"content": "User lives in Berlin. User is a nurse.", "confidence": 0.92, "tier": "core", "type": "fact"}
MAX_RETRIES = 2  # so every failing call makes exactly 3 requests
TIMEOUT = 0.5


def make_provider(server: FakeOpenAIServer, **overrides: Any) -> OpenAIChatProvider:
    """A provider on ``server`` with a short timeout and a near-zero back-off, so tests stay fast."""
    arguments: dict[str, Any] = {
        "base_url": server.base_url,
        "model": "test-model",
        "api_key": None,
        "timeout_seconds": TIMEOUT,
        "max_retries": MAX_RETRIES,
        "backoff_multiplier": 0.001,
        "backoff_max_seconds": 0.01,
    }
    arguments.update(overrides)
    return OpenAIChatProvider(**arguments)


def test_valid_output_is_parsed(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.json(GOOD))
    result = make_provider(openai_server).distill(EXCHANGE)
    assert (result.content, result.confidence, result.tier, result.memory_type) == (GOOD["content"], 0.92, "core", "fact")
    assert result.stats.attempts == 1 and result.stats.latency_ms > 0
    assert result.stats.prompt_tokens is None and result.stats.completion_tokens is None  # none reported

    (request,) = openai_server.requests
    assert request.path == "/v1/chat/completions"
    body = request.body
    assert body["model"] == "test-model" and body["temperature"] == 0
    # Structured output with the answer's pydantic model as the schema, OpenAI's form first.
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "distillation", "strict": True, "schema": response_schema(DistillationOutput)}}
    assert "max_tokens" not in body  # none configured
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert prompts.parse_payload(body["messages"][1]["content"]) == ("distil", {"exchange": EXCHANGE})
    assert request.headers["authorization"] == "Bearer not-needed"


def test_malformed_json_then_valid_succeeds_on_the_second_attempt(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.text('{"content": "User lives in Berl'), Reply.json(GOOD))
    result = make_provider(openai_server).distill(EXCHANGE)
    assert result.content == GOOD["content"]
    assert result.stats.attempts == 2
    assert len(openai_server.chat_requests) == 2


def test_always_malformed_raises_output_error_after_all_attempts(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(*[Reply.text("I am not JSON at all, sorry.\nSecond line.")] * (MAX_RETRIES + 1))
    with pytest.raises(LLMOutputError) as caught:
        make_provider(openai_server).distill(EXCHANGE)
    reason = caught.value.reason
    assert "\n" not in reason
    assert reason.startswith("distill failed after 3 attempts: reply is not JSON")
    assert "'I am not JSON at all, sorry. Second line.'" in reason
    assert caught.value.attempts == 3
    assert len(openai_server.chat_requests) == MAX_RETRIES + 1


def test_out_of_range_confidence_is_rejected_not_clamped(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(*[Reply.json({**GOOD, "confidence": 100})] * (MAX_RETRIES + 1))
    with pytest.raises(LLMOutputError, match=r"confidence 100 is outside \[0, 1\]"):
        make_provider(openai_server).distill(EXCHANGE)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ([], "reply is a JSON array, expected an object with content, confidence, tier"),
        ({"content": "User lives in Berlin."}, "missing field 'confidence'; missing field 'tier'"),
        ({"answer": "User lives in Berlin."}, "missing field 'content'"),
        ({**GOOD, "confidence": "high"}, "confidence must be a number in [0, 1], got string 'high'"),
        ({**GOOD, "tier": "urgent"}, "tier 'urgent' is not one of core, medium, low"),
        ({**GOOD, "type": "opinion"}, "type 'opinion' is not one of instruction, preference, fact, event"),
        ({**GOOD, "content": ""}, "content is blank"),
        ({**GOOD, "content": "A is. B is. C is. D is. E is."}, "content has 5 sentences, expected 1 to 4"),
    ],
)
def test_wrong_shape_raises_output_error(openai_server: FakeOpenAIServer, reply: object, expected: str) -> None:
    openai_server.script(*[Reply.json(reply)] * (MAX_RETRIES + 1))
    with pytest.raises(LLMOutputError) as caught:
        make_provider(openai_server).distill(EXCHANGE)
    assert expected in caught.value.reason


def test_json_in_code_fences_is_accepted(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.text("```json\n" + json.dumps(GOOD) + "\n```"))
    assert make_provider(openai_server).distill(EXCHANGE).tier == "core"


def test_truncated_reply_says_so(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.text('{"content": "User li', finish_reason="length"))
    with pytest.raises(LLMOutputError, match="reply truncated at the token limit; reply is not JSON"):
        make_provider(openai_server, max_retries=0).distill(EXCHANGE)


def test_a_response_without_choices_is_invalid_output(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.raw({"id": "x", "object": "chat.completion", "choices": []}), Reply.json(GOOD))
    result = make_provider(openai_server).distill(EXCHANGE)
    assert result.stats.attempts == 2


def test_http_500_then_ok_succeeds(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.status(500), Reply.json(GOOD))
    result = make_provider(openai_server).distill(EXCHANGE)
    assert result.stats.attempts == 2 and len(openai_server.chat_requests) == 2


def test_http_500_forever_is_unavailable_after_exactly_max_retries_plus_one_requests(
    openai_server: FakeOpenAIServer,
) -> None:
    openai_server.replier = lambda request: Reply.status(503, {"error": {"message": "model is loading"}})
    with pytest.raises(LLMUnavailable) as caught:
        make_provider(openai_server).distill(EXCHANGE)
    assert not isinstance(caught.value, LLMRequestRejected)
    assert caught.value.reason == (
        f"distill failed after 3 attempts: HTTP 503 from {openai_server.base_url}: model is loading"
    )
    assert len(openai_server.chat_requests) == MAX_RETRIES + 1


def test_rate_limit_is_retried(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.status(429, headers={"Retry-After": "0"}), Reply.json(GOOD))
    assert make_provider(openai_server).distill(EXCHANGE).stats.attempts == 2


@pytest.mark.parametrize("code", [400, 401, 404, 422])
def test_client_errors_are_not_retried(openai_server: FakeOpenAIServer, code: int) -> None:
    openai_server.script(Reply.status(code), Reply.json(GOOD))
    with pytest.raises(LLMRequestRejected) as caught:
        make_provider(openai_server).distill(EXCHANGE)
    assert f"HTTP {code}" in caught.value.reason and "(not retried)" in caught.value.reason
    assert caught.value.attempts == 1
    assert isinstance(caught.value, LLMUnavailable)
    assert len(openai_server.chat_requests) == 1


def test_api_key_is_sent_but_never_shown(openai_server: FakeOpenAIServer) -> None:
    key = "sk-test-very-secret-123"
    # An endpoint that echoes the key back in its error, as some proxies do.
    openai_server.script(Reply.status(401, {"error": {"message": f"invalid key {key}"}}))
    provider = make_provider(openai_server, api_key=key)
    with pytest.raises(LLMRequestRejected) as caught:
        provider.distill(EXCHANGE)
    assert key not in caught.value.reason and "invalid key ***" in caught.value.reason
    assert key not in repr(provider)
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {key}"


def test_timeout_is_unavailable(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.delay(3.0, Reply.json(GOOD)))
    started = time.perf_counter()
    with pytest.raises(LLMUnavailable, match=r"no reply from .* within 0.5 s"):
        make_provider(openai_server, max_retries=0).distill(EXCHANGE)
    assert time.perf_counter() - started < 2.0


def test_slow_reply_within_the_timeout_succeeds(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.delay(0.1, Reply.json(GOOD)))
    result = make_provider(openai_server).distill(EXCHANGE)
    assert result.stats.attempts == 1 and result.stats.latency_ms >= 100


def test_timeout_then_ok_is_retried(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.delay(2.0, Reply.json(GOOD)), Reply.json(GOOD))
    assert make_provider(openai_server).distill(EXCHANGE).stats.attempts == 2


def test_closed_connection_is_retried(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.close(), Reply.json(GOOD))
    result = make_provider(openai_server).distill(EXCHANGE)
    assert result.stats.attempts == 2 and len(openai_server.chat_requests) == 2


def test_closed_connection_forever_is_unavailable(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(*[Reply.close()] * (MAX_RETRIES + 1))
    with pytest.raises(LLMUnavailable, match="failed after 3 attempts: cannot reach"):
        make_provider(openai_server).distill(EXCHANGE)
    assert len(openai_server.chat_requests) == MAX_RETRIES + 1


def test_nothing_listening_is_unavailable() -> None:
    server = FakeOpenAIServer().start()
    base_url = server.base_url
    server.stop()
    provider = OpenAIChatProvider(base_url, "m", timeout_seconds=TIMEOUT, max_retries=1, backoff_multiplier=0.001)
    with pytest.raises(LLMUnavailable, match="failed after 2 attempts: cannot reach"):
        provider.distill(EXCHANGE)


def test_token_usage_is_captured_and_summed_over_attempts(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.json(GOOD).usage(120, 30))
    stats = make_provider(openai_server).distill(EXCHANGE).stats
    assert (stats.prompt_tokens, stats.completion_tokens) == (120, 30)

    openai_server.script(Reply.text("not json").usage(100, 5), Reply.json(GOOD).usage(100, 25))
    stats = make_provider(openai_server).distill(EXCHANGE).stats
    assert (stats.prompt_tokens, stats.completion_tokens, stats.attempts) == (200, 30, 2)


def test_consolidate_conflict_and_relevance_parse(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(
        Reply.json({"content": "User lives in Paris. User likes jazz."}),
        Reply.json({"score": 0.9}),
        Reply.json({"score": 0}),
    )
    provider = make_provider(openai_server)
    assert provider.consolidate("User lives in Berlin.", "User lives in Paris.").content.startswith("User lives in Paris")
    assert provider.conflict_score("User lives in Berlin.", "User lives in Paris.").score == 0.9
    assert provider.relevance_score("User lives in Paris.", "User: hi\nAssistant: hello").score == 0.0
    tasks = [prompts.parse_payload(r.body["messages"][1]["content"]) for r in openai_server.chat_requests]
    assert tasks == [
        ("consolidate", {"older": "User lives in Berlin.", "newer": "User lives in Paris."}),
        ("conflict", {"a": "User lives in Berlin.", "b": "User lives in Paris."}),
        ("relevance", {"memory": "User lives in Paris.", "turn": "User: hi\nAssistant: hello"}),
    ]


def test_out_of_range_score_is_rejected(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(*[Reply.json({"score": 7})] * (MAX_RETRIES + 1))
    with pytest.raises(LLMOutputError, match=r"conflict failed after 3 attempts: score 7 is outside \[0, 1\]"):
        make_provider(openai_server).conflict_score("a", "b")


def test_retries_are_logged_on_one_line(openai_server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    openai_server.script(Reply.status(500), Reply.json(GOOD))
    with caplog.at_level(logging.WARNING, logger="yak_pipeline.llm.openai_client"):
        make_provider(openai_server).distill(EXCHANGE)
    (record,) = caplog.records
    assert "distill attempt 1/3 failed (HTTP 500" in record.getMessage()


def test_concurrent_calls_share_one_provider(openai_server: FakeOpenAIServer) -> None:
    provider = make_provider(openai_server)
    exchanges = [f"User: I live in City{i}.\nAssistant: ok" for i in range(12)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(provider.distill, exchanges))
    assert [r.content for r in results] == [f"User lives in City{i}." for i in range(12)]
    assert all(r.stats.prompt_tokens for r in results)  # the default replier reports usage
    assert len(openai_server.chat_requests) == 12


def test_default_replier_answers_every_task_validly(openai_server: FakeOpenAIServer) -> None:
    provider = make_provider(openai_server)
    assert provider.distill("User: I love hiking.\nAssistant: Nice!").content == "User loves hiking."
    assert provider.conflict_score("User lives in Berlin.", "User lives in Paris.").score >= 0.8
    assert provider.relevance_score("User lives in Berlin.", "Weather in Berlin?").score > 0.3
    assert provider.consolidate("User likes jazz.", "User lives in Paris.").content == (
        "User lives in Paris. User likes jazz."
    )


def test_from_settings_and_get_llm_provider(openai_server: FakeOpenAIServer) -> None:
    settings = Settings(
        llm_base_url=openai_server.base_url,
        llm_model="from-settings",
        llm_api_key="sk-settings",
        llm_timeout_seconds=TIMEOUT,
        llm_max_retries=1,
    )
    provider = get_llm_provider(settings)
    assert isinstance(provider, OpenAIChatProvider) and isinstance(provider, LLMProvider)
    assert provider.name == "openai" and provider.model == "from-settings" and provider.max_retries == 1
    provider.distill(EXCHANGE)
    request = openai_server.requests[0]
    assert request.body["model"] == "from-settings"
    assert request.headers["authorization"] == "Bearer sk-settings"
    assert isinstance(get_llm_provider(Settings()), RulesProvider)


def test_fake_server_embeddings_and_models(openai_server: FakeOpenAIServer) -> None:
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0, timeout=TIMEOUT)
    response = client.embeddings.create(model="nomic-embed-text", input=["alpha", "beta", "alpha"])
    vectors = [row.embedding for row in sorted(response.data, key=lambda row: row.index)]
    assert [len(v) for v in vectors] == [768] * 3
    assert vectors[0] == pytest.approx(vectors[2]) and vectors[0] != pytest.approx(vectors[1])
    assert sum(v * v for v in vectors[0]) == pytest.approx(1.0, abs=1e-5)
    assert vectors[0] == pytest.approx(fake_embedding("alpha", 768), abs=1e-6)  # base64 float32 round trip

    floats = client.embeddings.create(model="m", input="alpha", encoding_format="float", dimensions=16)
    assert len(floats.data[0].embedding) == 16

    openai_server.script_embeddings(Reply.status(500))
    with pytest.raises(openai.InternalServerError):
        client.embeddings.create(model="m", input="alpha")

    assert [m.id for m in client.models.list()] == ["fake-model"]


# --- structured output, repair prompts and per-call stats (issue 17) ---------------------------

# How llama-cpp-python 0.3.36's server refuses OpenAI's json_schema form: a 500 carrying the
# validation error on response_format.type (seen against the real server, issue 17).
LLAMA_CPP_REFUSAL = {"error": {"message": "1 validation error: {'type': 'literal_error', 'loc': ('body', "
                                          "'response_format', 'type'), 'msg': \"Input should be 'text' or "
                                          "'json_object'\", 'input': 'json_schema'}", "type": "internal_server_error"}}


def test_the_response_schema_is_the_output_model() -> None:
    schema = response_schema(DistillationOutput)
    assert schema["required"] == ["content", "confidence", "tier", "type"] and schema["additionalProperties"] is False
    assert schema["properties"]["confidence"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert schema["properties"]["tier"] == {"type": "string", "enum": ["core", "medium", "low"]}
    assert schema["properties"]["type"] == {"type": "string", "enum": ["instruction", "preference", "fact", "event"]}
    assert response_schema(ScoreOutput)["properties"] == {"score": {"type": "number", "minimum": 0, "maximum": 1}}


@pytest.mark.parametrize("code", [400, 422, 500])
def test_auto_falls_back_to_the_form_the_server_takes_and_keeps_it(openai_server: FakeOpenAIServer, code: int) -> None:
    openai_server.script(Reply.status(code, LLAMA_CPP_REFUSAL), Reply.json(GOOD), Reply.json({"score": 0.2}))
    provider = make_provider(openai_server)
    result = provider.distill(EXCHANGE)
    assert result.content == GOOD["content"] and result.stats.attempts == 1
    first, second = (r.body["response_format"] for r in openai_server.chat_requests)
    assert first["type"] == "json_schema"
    assert second == {"type": "json_object", "schema": response_schema(DistillationOutput)}
    assert provider.structured_output == "json_object_schema"
    provider.conflict_score("User lives in Berlin.", "User lives in Paris.")  # asks in the kept form at once
    assert openai_server.chat_requests[2].body["response_format"] == {
        "type": "json_object", "schema": response_schema(ScoreOutput)}


def test_a_fixed_form_is_never_changed(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.status(422, LLAMA_CPP_REFUSAL))
    provider = make_provider(openai_server, structured_output="json_schema")
    with pytest.raises(LLMRequestRejected, match="HTTP 422"):
        provider.distill(EXCHANGE)
    assert len(openai_server.chat_requests) == 1
    make_provider(openai_server, structured_output="json_object").distill(EXCHANGE)
    assert openai_server.chat_requests[-1].body["response_format"] == {"type": "json_object"}


def test_a_retry_after_invalid_output_says_what_was_wrong_and_samples(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.json({**GOOD, "confidence": 92}), Reply.json(GOOD))
    result = make_provider(openai_server, max_tokens=64).distill(EXCHANGE)
    assert result.stats.attempts == 2 and result.stats.invalid_outputs == 1
    first, second = (r.body for r in openai_server.chat_requests)
    assert first["temperature"] == 0 and second["temperature"] == RETRY_TEMPERATURE
    assert first["max_tokens"] == second["max_tokens"] == 64
    retry_message = second["messages"][1]["content"]
    assert retry_message.startswith("Your previous answer was rejected: confidence 92 is outside [0, 1].")
    # The payload is still the message's last line, untouched: the rejection is an instruction, the exchange data.
    assert prompts.parse_payload(retry_message) == ("distil", {"exchange": EXCHANGE})


def test_stats_name_the_model_that_answered(openai_server: FakeOpenAIServer) -> None:
    stats = make_provider(openai_server).distill(EXCHANGE).stats
    assert stats.model == "test-model" and stats.invalid_outputs == 0  # the fake server echoes the model asked for
    assert RulesProvider().distill(EXCHANGE).stats.model == "rules"


def test_a_call_that_gives_up_counts_its_invalid_answers(openai_server: FakeOpenAIServer) -> None:
    openai_server.script(Reply.status(500), Reply.text("no json here"), Reply.text("still none"))
    with pytest.raises(LLMOutputError) as caught:
        make_provider(openai_server).distill(EXCHANGE)
    assert (caught.value.attempts, caught.value.invalid_outputs) == (3, 2)
