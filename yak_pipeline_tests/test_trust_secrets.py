"""Secrets people paste into a chat are never kept (issue 35, part 1).

A seeded set of realistic fakes (provider API keys, tokens, private keys, JWTs, passwords said in
words, Luhn-valid card numbers, IBANs with their check digits, …) goes in through every surface
that writes: the API (memories and turns), the CLI, MCP's save, the memory proxy's stored turn,
the drop folder and a history import; then the pipeline distils everything. Afterwards not one
secret is found verbatim in any row of any table, in MEMORY.md, in the server's log, or in what
the loopback upstream received when later chats recalled those memories. The detector's false
positives are measured on every LoCoMo dev turn, and ordinary look-alikes are left alone.
"""

from __future__ import annotations

import json
import random
import string
import subprocess
from datetime import UTC
from pathlib import Path

import anyio
import httpx
import httpx2
import openai
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from yak_loopback.openai_replies import chat_replier
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.dependencies import ApiServices
from yak_pipeline.api.mcp_server import MCP_PATH, mcp_http_app
from yak_pipeline.core.secrets import (
    SecretRefused,
    find_secrets,
    iban_valid,
    luhn_valid,
    redact_secrets,
    screen_secrets,
)
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import rows_mentioning, serve_in_thread
from yak_pipeline_tests.reliability_helpers import YAK, report_figure, yak_env, yak_serve

ADMIN_KEY = "adm-trust-35-admin-key"
LOCOMO_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo_dev.json"


# --- realistic fakes --------------------------------------------------------------------------

def _chars(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


_ALNUM = string.ascii_letters + string.digits


def _card(rng: random.Random, prefix: str, length: int) -> str:
    """A Luhn-valid card number with a real issuer prefix, printed in groups of four."""
    body = prefix + _chars(rng, string.digits, length - len(prefix) - 1)
    check = next(d for d in string.digits if luhn_valid(body + d))
    digits = body + check
    return " ".join(digits[i:i + 4] for i in range(0, len(digits), 4))


def _iban(rng: random.Random, country: str, length: int) -> str:
    """An IBAN with correct check digits, printed in groups of four."""
    account = _chars(rng, string.digits, length - 4)
    number = int("".join(str(int(c, 36)) for c in account + country + "00"))
    iban = f"{country}{98 - number % 97:02d}{account}"
    assert iban_valid(iban)
    return " ".join(iban[i:i + 4] for i in range(0, len(iban), 4))


def _jwt(rng: random.Random) -> str:
    import base64
    part = lambda obj: base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()  # noqa: E731
    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part({'sub': _chars(rng, string.digits, 8), 'name': 'Sam'})}." \
           f"{_chars(rng, _ALNUM + '-_', 43)}"


def fake_secrets(count_per_kind: int = 4, seed: int = 35) -> list[tuple[str, str]]:
    """``(kind, sentence holding the secret)`` … and the secret itself is what must vanish: returned as
    ``(secret, sentence)`` pairs, ``count_per_kind`` of each of 16 kinds."""
    rng = random.Random(seed)
    makers = {
        "openai": lambda: "sk-proj-" + _chars(rng, _ALNUM + "-_", 48),
        "anthropic": lambda: "sk-ant-api03-" + _chars(rng, _ALNUM + "-_", 93) + "AA",
        "aws access key": lambda: "AKIA" + _chars(rng, string.ascii_uppercase + string.digits, 16),
        "github": lambda: "ghp_" + _chars(rng, _ALNUM, 36),
        "slack": lambda: f"xoxb-{_chars(rng, string.digits, 11)}-{_chars(rng, string.digits, 13)}-{_chars(rng, _ALNUM, 24)}",
        "google": lambda: "AIza" + _chars(rng, _ALNUM + "-_", 35),
        "stripe": lambda: "sk_live_" + _chars(rng, _ALNUM, 24),
        "sendgrid": lambda: "SG." + _chars(rng, _ALNUM, 22) + "." + _chars(rng, _ALNUM, 43),
        "gitlab": lambda: "glpat-" + _chars(rng, _ALNUM, 20),
        "jwt": lambda: _jwt(rng),
        "private key": lambda: "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(
            _chars(rng, _ALNUM + "+/", 70) for _ in range(4)) + "\n-----END OPENSSH PRIVATE KEY-----",
        "password": lambda: _chars(rng, string.ascii_letters, 6) + _chars(rng, string.digits, 3) + rng.choice("!#%&*"),
        "card": lambda: _card(rng, rng.choice(["4", "51", "55", "2221", "6011"]), 16),
        "iban": lambda: _iban(rng, *rng.choice([("DE", 22), ("GB", 22), ("FR", 27), ("NL", 18)])),
        "db url password": lambda: "Pw" + _chars(rng, _ALNUM, 14),
        "bearer": lambda: _chars(rng, _ALNUM, 40),
    }
    sentences = {
        "openai": "Here is my OpenAI key {s}, please remember it.",
        "anthropic": "My Claude key is {s} for the side project.",
        "aws access key": "The deploy user has access key id {s} in us-east-1.",
        "github": "Use the token {s} to push to the repo.",
        "slack": "Our bot posts with {s} into #general.",
        "google": "The maps widget needs {s} set in the env.",
        "stripe": "Billing runs on {s} now.",
        "sendgrid": "Mail goes out through SendGrid with {s}.",
        "gitlab": "CI clones with {s}.",
        "jwt": "The session cookie was {s} when it broke.",
        "private key": "This is the server key:\n{s}\nkeep it safe.",
        "password": "My password is {s} for the bank.",
        "card": "Pay the deposit with my card {s}, expiry 09/29.",
        "iban": "Send the rent to IBAN {s} by Friday.",
        "db url password": "Connect to postgres://sam:{s}@db.example.net:5432/app please.",
        "bearer": "The webhook wants Authorization: Bearer {s} in every call.",
    }
    out = []
    for kind, make in makers.items():
        for _ in range(count_per_kind):
            secret = make()
            out.append((secret, sentences[kind].format(s=secret)))
    return out


def _verbatim(text: str, secrets: list[str]) -> list[str]:
    """The secrets found in ``text`` (a card or IBAN also without its spaces)."""
    flat = text.replace(" ", "")
    return [s for s in secrets if s in text or (" " in s and s.replace(" ", "") in flat)]


# --- the detector -----------------------------------------------------------------------------

def test_every_seeded_secret_is_replaced_by_its_typed_placeholder() -> None:
    seeded = fake_secrets()
    assert len(seeded) >= 50 and len({s for s, _ in seeded}) == len(seeded)
    for secret, sentence in seeded:
        redacted = redact_secrets(sentence)
        assert not _verbatim(redacted.text, [secret]), sentence
        assert redacted.count >= 1 and "[secret: " in redacted.text
        assert redact_secrets(redacted.text).text == redacted.text  # redacting twice changes nothing
    assert redact_secrets("My password is hunter2!").text == "My password is [secret: password]"
    assert redact_secrets("It is hunter2. My password is hunter2.").text == "It is [secret: password]. My password is [secret: password]."
    assert redact_secrets("card 4111 1111 1111 1111").text == "card [secret: payment card]"
    # An IBAN followed by words in capitals ends where its country's length says.
    assert redact_secrets("IBAN DE89 3704 0044 0532 0130 00 BY FRIDAY").text == "IBAN [secret: iban] BY FRIDAY"


@pytest.mark.parametrize("text", [
    "Order 112-3456789-1234567 shipped; tracking 1Z999AA10123456784.",
    "I reverted 3f786850e387550fdab836ed7e6dc881de23001b and cherry-picked a1b2c3d onto main.",
    "Call me on +1 (415) 555-0132 or +44 20 7946 0958.",
    "My password is too long to type on the TV, and the wifi password is written on the fridge.",
    "The api key is in the vault; ask Jo for a token of appreciation.",
    "ISBN 978-3-16-148410-0, invoice INV-2024-000123, flight LH 454 on 2024-05-06.",
    "My SSN-like code 123-45-6789 and zip 94103; 4111 apples, version 1.2.3.4.",
    "Love you, xoxo-hugs-and-kisses! The passcode: see email.",
    "UUID 123e4567-e89b-12d3-a456-426614174000 and sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    # Code talk (BEAM's coding chats): expressions, markup and variable names after "password".
    "    password = data.get('password')\n    password = request.form[\"password\"]\n",
    "    password = db.Column(db.String(120), nullable=False)\n    password = PasswordField('Password')",
    "<label for=\"password\">Password:</label>\n<input type=\"password\"> password: {{ form.password }}",
    "new_user = User(username=username, password=hashed_password)\npassword: config.DB_PASSWORD",
])
def test_ordinary_look_alikes_are_left_alone(text: str) -> None:
    assert find_secrets(text) == []


def test_false_positive_rate_on_every_locomo_dev_turn() -> None:
    if not LOCOMO_DEV.exists():
        pytest.skip(f"{LOCOMO_DEV} is not on this machine")
    conversations = json.loads(LOCOMO_DEV.read_text())
    turns = [turn["text"] for c in conversations for key, session in c["conversation"].items()
             if key.startswith("session_") and isinstance(session, list) for turn in session]
    flagged = [t for t in turns if find_secrets(t)]
    rate = len(flagged) / len(turns)
    report_figure("secrets false positives (LoCoMo dev)",
                  f"{len(flagged)} of {len(turns)} turns flagged: {rate:.2%}")
    print(f"[trust] false positives on LoCoMo dev: {len(flagged)} of {len(turns)} turns ({rate:.3%})")
    assert len(turns) > 2000
    assert rate <= 0.005, flagged[:5]


def test_refuse_policy_raises_with_kinds_never_the_value() -> None:
    secret = "sk-proj-" + "A1b2" * 12
    with pytest.raises(SecretRefused) as refused:
        screen_secrets(f"my key {secret}", "refuse")
    assert "api key" in str(refused.value) and secret not in str(refused.value)
    assert "\n" not in str(refused.value)
    assert screen_secrets("nothing here", "refuse").text == "nothing here"


# --- every surface ------------------------------------------------------------------------------

def _claude_export(pairs: list[tuple[str, str]]) -> str:
    """A Claude.ai ``conversations.json`` with one conversation of ``pairs`` (user, assistant)."""
    messages = []
    for i, (user, assistant) in enumerate(pairs):
        for j, (sender, text) in enumerate((("human", user), ("assistant", assistant))):
            at = f"2026-03-{10 + i % 15:02d}T09:{j:02d}:00.000000Z"
            messages.append({"uuid": f"m-{i}-{j}", "text": text, "content": [{"type": "text", "text": text}],
                             "sender": sender, "created_at": at, "updated_at": at, "attachments": [], "files": []})
    return json.dumps([{"uuid": "c0ffee00-0000-4000-8000-000000000035", "name": "keys and things", "summary": "",
                        "created_at": "2026-03-10T09:00:00Z", "updated_at": "2026-03-10T09:00:00Z",
                        "account": {"uuid": "acc"}, "chat_messages": messages}])


async def _mcp_save(url: str, key: str, facts: list[str]) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=30))) as mcp:
        for fact in facts:
            result = await mcp.call_tool("memory_save", {"fact": fact})
            assert not result.is_error, result.content


def test_secrets_written_through_every_surface_are_never_stored_exported_logged_or_sent_upstream(
        db_url: str, database: Database, settings: Settings, tmp_path: Path) -> None:
    seeded = fake_secrets()
    secrets = [s for s, _ in seeded]
    sentences = [t for _, t in seeded]
    # Six surfaces take turns, so each sees every kind.
    by_surface: dict[str, list[str]] = {name: sentences[i::7] for i, name in enumerate(
        ("api", "api_turn", "cli", "mcp", "proxy", "drop", "import"))}
    drop = tmp_path / "drop"
    drop.mkdir()
    upstream = FakeOpenAIServer(chat_replier).start()
    try:
        env = yak_env(db_url, tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_DROP_DIR=str(drop),
                      YAK_UPSTREAM_BASE_URL=upstream.base_url, YAK_PROXY_RECALL_THRESHOLD="0.05",
                      YAK_PROXY_RECALL_LIMIT="20")
        with yak_serve(env, tmp_path) as server, httpx.Client(base_url=server.url, timeout=60) as api:
            key = api.post("/api/keys", headers={"X-API-Key": ADMIN_KEY},
                           json={"user_id": "sam", "label": "trust"}).json()["key"]
            headers = {"X-API-Key": key}
            for text in by_surface["api"]:
                response = api.post("/api/memories/", headers=headers,
                                    json={"user_id": "sam", "content": f"User: {text}\nAssistant: Noted."})
                assert response.status_code == 201, response.text
                assert "[secret: " in response.json()["content"]
            for text in by_surface["api_turn"]:
                response = api.post("/api/turns", headers=headers, json={
                    "user_id": "sam", "user_message": text, "assistant_message": f"You said: {text}"})
                assert response.status_code == 202, response.text
            cli_env = {**env, "YAK_API_URL": server.url, "YAK_API_KEY": key}
            for text in by_surface["cli"]:
                done = subprocess.run([str(YAK), "memory", "add", f"User: {text}\nAssistant: ok", "--user", "sam"],
                                      env=cli_env, capture_output=True, text=True, timeout=120, check=False)
                assert done.returncode == 0, done.stderr[-2000:]
            services = ApiServices.of(settings.model_copy(update={"admin_api_key": None}),
                                   database=Database(db_url, max_size=2).open())
            with serve_in_thread(mcp_http_app(services)) as mcp_url:
                anyio.run(_mcp_save, f"{mcp_url}{MCP_PATH}", key, by_surface["mcp"])
            proxy = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=30)
            for text in by_surface["proxy"]:
                proxy.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": text}])
            written_upstream = len(upstream.chat_requests)
            (drop / "pasted.jsonl").write_text("".join(
                json.dumps({"user_id": "sam", "user": text, "assistant": "Got it.",
                            "occurred_at": "2026-03-14T10:00:00Z"}) + "\n" for text in by_surface["drop"]))
            export = tmp_path / "conversations.json"
            export.write_text(_claude_export([(text, "I'll remember that.") for text in by_surface["import"]]))
            imported = subprocess.run([str(YAK), "import", str(export), "--user", "sam", "--json"],
                                      env=env, capture_output=True, text=True, timeout=300, check=False)
            assert imported.returncode == 0, imported.stderr[-2000:]
            assert json.loads(imported.stdout)["totals"]["exchanges"] == len(by_surface["import"])
            # The drop folder is claimed and everything distilled (rules provider, offline).
            processed = subprocess.run([str(YAK), "process", "--json"], env=env, capture_output=True, text=True,
                                       timeout=600, check=False)
            assert processed.returncode == 0, processed.stderr[-3000:]

            # Later chats recall those memories: the block sent upstream holds none of the secrets.
            for question in ("What keys and passwords did I give you?", "Where do I send the rent?",
                             "Which card should pay the deposit?", "What is the server key?"):
                proxy.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": question}])
            recalled = upstream.chat_requests[written_upstream:]
            memory_md = api.get("/api/export/memory.md", headers=headers)
            assert memory_md.status_code == 200, memory_md.text
            metrics = api.get("/metrics", headers={"X-API-Key": ADMIN_KEY}).text
            searched = api.post("/api/distillations/search", headers=headers,
                                json={"user_id": "sam", "query": "password card key token", "threshold": 0.0,
                                      "limit": 50}).text
        logs = server.logs()
    finally:
        upstream.stop()

    with database.connection() as conn:
        stored = conn.execute("SELECT count(*) FROM memories WHERE user_id = 'sam'").fetchone()[0]
        distilled = conn.execute("SELECT count(*) FROM distillations WHERE user_id = 'sam'").fetchone()[0]
        placeholders = conn.execute("SELECT count(*) FROM memories WHERE content LIKE '%%[secret: %%'").fetchone()[0]
        leaks = {s[:12]: found for s in secrets if (found := rows_mentioning(conn, s))}
        flat_leaks = [s[:12] for s in secrets if " " in s and rows_mentioning(conn, s.replace(" ", ""))]
        audited = conn.execute("SELECT count(*) FROM audit_log WHERE action = 'redact_secrets'").fetchone()[0]
        audit_text = " ".join(r[0] for r in conn.execute("SELECT detail::text FROM audit_log").fetchall())
    report_figure("secrets through every surface",
                  f"{len(secrets)} secrets of 16 kinds, {stored} memories, {distilled} distillations, "
                  f"{len(recalled)} recalled chats upstream, {len(logs.splitlines())} log lines: "
                  f"{len(leaks) + len(flat_leaks)} found verbatim")
    assert stored >= len(sentences) and distilled > 0 and placeholders >= len(sentences) - len(by_surface["api_turn"])
    assert leaks == {} and flat_leaks == []
    assert len(recalled) == 4 and "[secret: " in json.dumps([r.body for r in recalled])
    for name, text in (("MEMORY.md", memory_md.text), ("search", searched), ("server log", logs),
                       ("upstream after the writes", json.dumps([r.body for r in recalled])),
                       ("audit log", audit_text)):
        assert _verbatim(text, secrets) == [], name
    assert "[secret: " in memory_md.text
    assert audited >= len(sentences) - len(by_surface["api_turn"])
    redacted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("yak_secrets_redacted_total{"))
    assert redacted >= len(secrets)


# --- refuse ---------------------------------------------------------------------------------------

def test_refuse_policy_rejects_every_write_with_one_line_and_stores_nothing(
        db_url: str, database: Database, tmp_path: Path) -> None:
    secret = "ghp_" + "Zx9" * 12
    drop = tmp_path / "drop"
    drop.mkdir()
    env = yak_env(db_url, tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_SECRETS="refuse", YAK_DROP_DIR=str(drop))
    with yak_serve(env, tmp_path) as server, httpx.Client(base_url=server.url, timeout=60) as api:
        admin = {"X-API-Key": ADMIN_KEY}
        response = api.post("/api/memories/", headers=admin,
                            json={"user_id": "sam", "content": f"User: push with {secret}\nAssistant: ok"})
        assert response.status_code == 422
        detail = response.json()["detail"]
        assert "secret" in detail and "access token" in detail and secret not in response.text and "\n" not in detail
        turn = api.post("/api/turns", headers=admin, json={"user_id": "sam", "user_message": f"token {secret}",
                                                           "assistant_message": "ok"})
        assert turn.status_code == 422 and secret not in turn.text
        cli = subprocess.run([str(YAK), "memory", "add", f"User: {secret}\nAssistant: ok", "--user", "sam"],
                             env={**env, "YAK_API_URL": server.url, "YAK_API_KEY": ADMIN_KEY},
                             capture_output=True, text=True, timeout=120, check=False)
        assert cli.returncode != 0 and "secret" in cli.stderr + cli.stdout and secret not in cli.stderr + cli.stdout
        fine = api.post("/api/memories/", headers=admin, json={"user_id": "sam", "content": "User: hi\nAssistant: ok"})
        assert fine.status_code == 201
        logs = server.logs()
    (drop / "pasted.jsonl").write_text(json.dumps({"user_id": "sam", "user": f"my token {secret}",
                                                   "assistant": "ok", "occurred_at": "2026-03-14T10:00:00Z"}) + "\n")
    processed = subprocess.run([str(YAK), "process", "--json"], env=env, capture_output=True, text=True, timeout=600,
                               check=False)
    assert processed.returncode == 0, processed.stderr[-3000:]
    quarantined = " ".join(p.read_text() for p in (drop / "failed").iterdir())
    assert "YAK_SECRETS=refuse" in quarantined and secret not in quarantined
    with database.connection() as conn:
        assert rows_mentioning(conn, secret) == {}
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 1
    assert secret not in logs


def test_a_record_quarantined_for_another_reason_does_not_keep_its_secret(database: Database) -> None:
    from datetime import datetime

    from yak_pipeline.ingestion.formats.exchange_records import ExchangeRecord
    from yak_pipeline.ingestion.records import ingest_records

    secret = "ghp_" + "Qr7" * 12
    report = ingest_records(database, [
        ExchangeRecord("sam", f"User: push with {secret}\nAssistant: ok", datetime(1999, 1, 1, tzinfo=UTC), 1),
        ExchangeRecord("sam", f"User: and again {secret}\nAssistant: ok", None, 2),
    ], source="drop_folder")
    (rejected,) = report.rejected
    assert "before 2000" in rejected.reason and secret not in rejected.raw and "[secret: access token]" in rejected.raw
    assert len(report.stored) == 1
    with database.connection() as conn:
        assert rows_mentioning(conn, secret) == {}
