"""Secrets in what people tell their assistant: found, and replaced by a typed placeholder.

One detector for every write (issue 35): an API key, token, private key, password, card number
or IBAN pasted into a chat must never be stored, embedded, distilled, exported or re-sent with a
later prompt. detect-secrets' provider plugins find the token formats they know (AWS, GitHub,
GitLab, Slack, Stripe, SendGrid, Twilio, npm, PyPI, …); the formats below add what a chat holds
and those plugins miss: today's OpenAI and Anthropic keys, Google keys, whole private-key blocks,
passwords said in words ("my password is …"), payment cards (Luhn-checked) and IBANs (mod-97
checked). Each secret becomes ``[secret: <kind>]``; the rest of the text is kept as it was.

Pure: regular expressions and checksums, no I/O.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

# What a write does with a secret: replace it (the default), or refuse the whole write.
SecretsPolicy = Literal["redact", "refuse"]
SECRETS_POLICIES: Final[tuple[SecretsPolicy, ...]] = get_args(SecretsPolicy)

SecretKind = Literal["api key", "access token", "private key", "jwt", "password", "payment card", "iban"]
SECRET_KINDS: Final[tuple[SecretKind, ...]] = get_args(SecretKind)

# A placeholder already in the text is never taken for a secret again (redacting twice is a no-op).
_PLACEHOLDER_RE: Final = re.compile(r"\[secret: (?:" + "|".join(SECRET_KINDS) + r")\]")

# detect-secrets' provider plugins and the kind each finds. Left out: the keyword and
# high-entropy plugins (made for source code: in prose they flag ordinary words and hashes),
# public IPs (not secrets), Artifactory (its `AP…` pattern matches words in capitals) and the
# IBM/SoftLayer/Cloudant ones (keyword-driven, for configuration files).
_PLUGINS: Final[tuple[tuple[type[RegexBasedDetector], SecretKind, int], ...]] = (
    # The number is the capturing group that is the secret itself (basic auth's password, the
    # AWS secret key beside its name, npm's token); 0, or a pattern without it: the whole match.
    (AWSKeyDetector, "api key", 1),
    (AzureStorageKeyDetector, "api key", 0),
    (BasicAuthDetector, "password", 1),
    (DiscordBotTokenDetector, "access token", 0),
    (GitHubTokenDetector, "access token", 0),
    (GitLabTokenDetector, "access token", 0),
    (MailchimpDetector, "api key", 0),
    (NpmDetector, "access token", 1),
    (OpenAIDetector, "api key", 0),
    (PypiTokenDetector, "access token", 0),
    (SendGridDetector, "api key", 0),
    (SlackDetector, "access token", 0),
    (SquareOAuthDetector, "api key", 0),
    (StripeDetector, "api key", 0),
    (TelegramBotTokenDetector, "access token", 0),
    (TwilioKeyDetector, "api key", 0),
)

# After a secret's name ("api key", "token"): an optional "is"/"="/":" and the value, 16+
# characters with at least one digit and one letter.
_NAMED_VALUE: Final = (r"[\"']?\s*(?:is|was|=|:|->)?\s*[\"'`]?"
                       r"((?=[A-Za-z0-9_\-./+=]*\d)(?=[A-Za-z0-9_\-./+=]*[A-Za-z])[A-Za-z0-9_\-./+=]{16,})")

# Formats the plugins miss, each with the group that is the secret (0: the whole match).
_FORMATS: Final[tuple[tuple[re.Pattern[str], SecretKind, int], ...]] = (
    # Anthropic (sk-ant-api03-…), OpenAI project/service/admin keys (sk-proj-…) and older sk-…
    (re.compile(r"(?<![A-Za-z0-9_-])sk-(?:ant-[a-z]+\d*-|proj-|svcacct-|admin-|None-)?[A-Za-z0-9_-]{20,}"), "api key", 0),
    (re.compile(r"(?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35}"), "api key", 0),                      # Google
    (re.compile(r"(?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test)_[0-9A-Za-z]{16,}"), "api key", 0),      # Stripe, test too
    (re.compile(r"(?<![A-Za-z0-9_])whsec_[0-9A-Za-z]{24,}"), "api key", 0),                        # Stripe webhooks
    (re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}"), "access token", 0),                      # Hugging Face
    (re.compile(r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{40,}"), "access token", 0),             # GitHub fine-grained
    # Slack, any shape (with a digit: "xoxo-hugs-and-kisses" is not one)
    (re.compile(r"(?<![A-Za-z0-9_-])xox[abposr]-(?=[A-Za-z-]*\d)[A-Za-z0-9-]{10,}"), "access token", 0),
    (re.compile(r"(?<![A-Za-z0-9_-])glpat-[A-Za-z0-9_-]{20,}"), "access token", 0),                # GitLab
    # The AWS secret access key beside its name (``aws_secret_access_key = …``), quoted or not.
    (re.compile(r"(?i)aws.{0,20}?secret.{0,20}?[=:]\s*[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"), "api key", 1),
    # A JWT: header and payload are base64url JSON objects (``eyJ`` is ``{"``).
    (re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), "jwt", 0),
    # A private key, the whole block (an unterminated one to the end of the text).
    (re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
                re.DOTALL), "private key", 0),
    (re.compile(r"PuTTY-User-Key-File-\d.*?(?:Private-MAC: \S+|\Z)", re.DOTALL), "private key", 0),
    # ``Authorization: Bearer …``, ``bearer token: …``
    (re.compile(r"(?i)\bbearer\s+([A-Za-z0-9._~+/-]{20,}=*)"), "access token", 1),
    # A key or token named as one: "api key: …", "my access token is …", "client_secret=…" (a
    # value of 16+ characters with a digit and a letter, so "the api key is in the vault" stays).
    (re.compile(r"(?i)\b(?:api[ _-]?key|secret[ _-]?key|client[ _-]?secret|app[ _-]?secret)s?\b" + _NAMED_VALUE), "api key", 1),
    (re.compile(r"(?i)\b(?:(?:access|auth|refresh|private|session)[ _-]?)?tokens?\b" + _NAMED_VALUE), "access token", 1),
)

# A password said in words: "my password is hunter2", "password: x", "the wifi passcode was …",
# "PIN is 4821". The value is the next token, unless it is an ordinary word ("my password is
# too long", "the password was changed"): those are talk about a password, not one.
_PASSWORD_RE: Final = re.compile(
    r"(?i)\b(?:pass(?:word|wd|code|phrase)|pwd|pin(?:\s+code)?)s?\b"
    r"(?:\s+(?:for|to|of|on|at)\s+(?:(?:my|the|our|your|his|her)\s+)?[\w.@'-]{1,30}(?:\s+[\w.@'-]{1,30})?)?"
    r"[ \t]*(?:is|was|=|:|->|is[ \t]*:)[ \t]*[\"'`“‘]?(?P<value>[^\s\"'`”’]{3,})"
)
# Code talk: ``password = data.get('password')``, ``password = request.form["password"]``,
# ``password = PasswordField(…)``, ``password: config.DB_PASSWORD``. A value that calls,
# indexes or names an attribute is an expression, not a password (BEAM's coding chats had 248
# such "passwords" in 35 of 2,362 turns, each then redacted wherever it recurred).
# So is markup or a template after a label ("Password:</label>", "password: {{ form.password }}")
# and a snake_case name (``User(password=hashed_password)``).
_CODE_VALUE_RE: Final = re.compile(
    r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*[(\[{]|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+[,;)]*$|[<{$%]|[a-z]+(?:_[a-z]+)+[,;)]*$")
_NOT_A_PASSWORD: Final = frozenset("""
a an the this that it its too very so not still just now also quite really pretty rather
being been set reset changed updated wrong right correct incorrect different same new old
weak strong secure safe long short hard easy simple complex required needed missing expired
saved stored written hidden lost forgotten protected encrypted case sensitive something nothing
what which there here my your our their his her mine yours in on at for to of and or but
see check ask below above attached sent email somewhere unknown
""".split())
_PIN_VALUE_RE: Final = re.compile(r"\d{4,8}")

# Payment cards: 13-19 digits, as one run or in the groups cards are printed in (4-4-4-4,
# 4-6-5, …), with a real issuer prefix and a valid Luhn check digit.
_CARD_RE: Final = re.compile(
    r"(?<![\d-])(?:\d{13,19}|\d{4}(?:[ -]\d{4}){2}[ -]\d{1,7}|\d{4}[ -]\d{6}[ -]\d{4,5})(?![\d-])")
_CARD_PREFIX_RE: Final = re.compile(r"4|5[1-5]|2(?:2[2-9][1-9]|[3-6]\d\d|7[01]\d|720)|3[47]|3(?:0[0-5]|[68])|6(?:011|5|4[4-9])|35(?:2[89]|[3-8])|62")

# IBANs: country, check digits, then the account (printed in groups of four or not).
_IBAN_RE: Final = re.compile(r"(?<![A-Za-z0-9])([A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30})(?![A-Za-z0-9])")
_IBAN_LENGTHS: Final[Mapping[str, int]] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29, "CH": 21,
    "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18,
    "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23,
    "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27,
    "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29,
    "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "TN": 24, "TR": 26,
    "UA": 29, "VG": 24, "XK": 20,
}


class SecretRefused(ValueError):
    """A write held a secret and the policy is ``refuse``: nothing of it was stored."""

    def __init__(self, kinds: Mapping[str, int]) -> None:
        self.kinds = dict(kinds)
        named = ", ".join(f"{count} {kind}" if count == 1 else f"{count} × {kind}" for kind, count in sorted(kinds.items()))
        super().__init__(f"the text holds a secret ({named}); nothing was stored: remove it and send the text "
                         f"again (YAK_SECRETS=refuse)")


@dataclass(frozen=True)
class SecretFound:
    """Where a secret is in a text (``start``:``end``) and what kind it is; never its value."""

    start: int
    end: int
    kind: SecretKind


@dataclass(frozen=True)
class Redaction:
    """A text with its secrets replaced, and how many of each kind were replaced."""

    text: str
    kinds: Counter[str] = field(default_factory=Counter)

    @property
    def count(self) -> int:
        """How many secrets were replaced."""
        return self.kinds.total()


def placeholder(kind: SecretKind) -> str:
    """What a secret of ``kind`` is replaced with."""
    return f"[secret: {kind}]"


def luhn_valid(digits: str) -> bool:
    """Whether a string of digits passes the Luhn check (payment cards)."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def iban_valid(candidate: str) -> bool:
    """Whether ``candidate`` (spaces allowed) is an IBAN: a known country's length and mod-97 = 1."""
    iban = candidate.replace(" ", "")
    if _IBAN_LENGTHS.get(iban[:2]) != len(iban) or not iban[2:4].isdigit():
        return False
    rearranged = iban[4:] + iban[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


def _group_span(match: re.Match[str], group: int) -> tuple[int, int]:
    if group and match.re.groups >= group and match.group(group) is not None:
        return match.span(group)
    return match.span()


def _plugin_spans(text: str) -> Iterator[SecretFound]:
    for plugin, kind, group in _PLUGINS:
        # detect-secrets declares denylist an abstract property; each detector class sets it as a
        # class attribute (a tuple of compiled patterns), which is what is read here.
        for pattern in plugin.denylist:  # type: ignore[attr-defined]
            for match in pattern.finditer(text):
                start, end = _group_span(match, group)
                if end > start:
                    yield SecretFound(start, end, kind)


def _format_spans(text: str) -> Iterator[SecretFound]:
    for pattern, kind, group in _FORMATS:
        for match in pattern.finditer(text):
            start, end = _group_span(match, group)
            yield SecretFound(start, end, kind)
    for match in _PASSWORD_RE.finditer(text):
        # Sentence punctuation after it is not part of it; "!" and "?" may be (redacting one too many
        # characters loses nothing, one too few leaves part of the password).
        value = match.group("value").rstrip(".,;:)")
        said_pin = match.group(0).lower().lstrip().startswith("pin")
        if (value.lower() in _NOT_A_PASSWORD or (said_pin and not _PIN_VALUE_RE.fullmatch(value))
                or _CODE_VALUE_RE.match(value)):
            continue
        start = match.start("value")
        yield SecretFound(start, start + len(value), "password")
        # Said once as a password, the same string elsewhere in the text is the password too.
        for again in re.finditer(r"(?<![\w])" + re.escape(value) + r"(?![\w])", text):
            yield SecretFound(again.start(), again.end(), "password")
    for match in _CARD_RE.finditer(text):
        digits = re.sub(r"[ -]", "", match.group(0))
        if 13 <= len(digits) <= 19 and _CARD_PREFIX_RE.match(digits) and luhn_valid(digits):
            yield SecretFound(match.start(), match.end(), "payment card")
    for match in _IBAN_RE.finditer(text):
        # The pattern may run on into a following word in capitals ("… 00 BY FRIDAY"): the
        # country's length says where the IBAN ends.
        start, length = match.start(1), _IBAN_LENGTHS.get(match.group(1)[:2])
        if length is None:
            continue
        taken = end = 0
        for end, char in enumerate(text[start:match.end(1)], start=start + 1):  # noqa: B007 - end is read after the loop
            taken += char != " "
            if taken == length:
                break
        if taken == length and iban_valid(text[start:end]):
            yield SecretFound(start, end, "iban")


def find_secrets(text: str) -> list[SecretFound]:
    """Every secret in ``text``, in order, overlapping finds merged (the longest wins the kind)."""
    placeholders = [m.span() for m in _PLACEHOLDER_RE.finditer(text)]
    found = sorted({*_plugin_spans(text), *_format_spans(text)}, key=lambda f: (f.start, -(f.end - f.start)))
    merged: list[SecretFound] = []
    for item in found:
        if any(s < item.end and item.start < e for s, e in placeholders):
            continue
        if merged and item.start < merged[-1].end:
            last = merged[-1]
            if item.end > last.end:
                merged[-1] = SecretFound(last.start, item.end, last.kind)
            continue
        merged.append(item)
    return merged


def redact_secrets(text: str) -> Redaction:
    """``text`` with every secret replaced by its typed placeholder (``[secret: api key]``)."""
    found = find_secrets(text)
    if not found:
        return Redaction(text)
    parts: list[str] = []
    position = 0
    for item in found:
        parts += [text[position:item.start], placeholder(item.kind)]
        position = item.end
    parts.append(text[position:])
    return Redaction("".join(parts), Counter(item.kind for item in found))


def screen_secrets(text: str, policy: SecretsPolicy) -> Redaction:
    """The text a write may store under ``policy``: redacted, or :class:`SecretRefused` when it held one."""
    if policy not in SECRETS_POLICIES:
        raise ValueError(f"unknown secrets policy {policy!r} (use one of {', '.join(SECRETS_POLICIES)})")
    redaction = redact_secrets(text)
    if redaction.count and policy == "refuse":
        raise SecretRefused(redaction.kinds)
    return redaction
