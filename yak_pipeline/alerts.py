"""Webhook alerts with levels and de-duplication across processes.

Levels: ``warn`` logs; ``error`` logs and posts to ``YAK_ERROR_WEBHOOK``; ``critical`` also posts
to ``YAK_CRITICAL_WEBHOOK``. Messages are Discord webhook JSON. The same alert type within
``YAK_ALERT_DEDUP_SECONDS`` is sent once, however many processes raise it: the window is claimed
with one atomic statement on the ``alert_state`` table. While the database cannot be reached
(the very moment ``db_connection_lost`` is raised) the window is claimed on a locked file under
``$YAK_HOME/alert-state`` instead, which every process sharing that home sees too. A failing
webhook or database never breaks the caller: alerting is best effort and says so in the log.
"""

from __future__ import annotations

import fcntl
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import httpx

from yak_pipeline.store.alert_state import claim_alert_window

logger = logging.getLogger("yak.alerts")

Level = Literal["warn", "error", "critical"]
ALERT_TYPES = ("distillation_failed", "embedding_failed", "db_connection_lost", "queue_overflow",
               "conflict_detected", "run_failed", "warmth_failed")


@dataclass(frozen=True)
class Alert:
    """One alert: its type, level, the ids involved, the error and the retry count."""

    type: str
    level: Level
    message: str
    ids: tuple[str, ...] = ()
    error: str | None = None
    retry: tuple[int, int] | None = None
    at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def discord_payload(self) -> dict:
        """The Discord webhook body: a short content line and one embed with the details."""
        fields = [{"name": "type", "value": self.type, "inline": True},
                  {"name": "level", "value": self.level, "inline": True}]
        if self.ids:
            fields.append({"name": "ids", "value": ", ".join(self.ids)[:1000]})
        if self.error:
            fields.append({"name": "error", "value": self.error[:1000]})
        if self.retry:
            fields.append({"name": "retry", "value": f"{self.retry[0]}/{self.retry[1]}", "inline": True})
        fields.append({"name": "time", "value": self.at.isoformat(timespec="seconds"), "inline": True})
        return {
            "content": f"[yak {self.level}] {self.type}: {self.message}"[:1900],
            "embeds": [{"title": f"{self.type} ({self.level})", "description": self.message[:2000],
                        "fields": fields}],
        }


class _HideWebhookUrls(logging.Filter):
    """Rewrites log records that quote a webhook URL (httpx logs every request's URL at INFO).

    Webhook URLs embed their token (Discord's do), so they are as secret as a key.
    """

    def __init__(self) -> None:
        super().__init__()
        # Replaced, never mutated: a logging thread always iterates a complete set.
        self.urls: frozenset[str] = frozenset()
        self._adding = threading.Lock()

    def hide(self, *urls: str | None) -> None:
        """Add webhook URLs to hide."""
        with self._adding:
            self.urls = self.urls | {u for u in urls if u}

    def filter(self, record: logging.LogRecord) -> bool:
        urls = self.urls
        if urls:
            message = record.getMessage()
            hidden = message
            for url in urls:
                hidden = hidden.replace(url, "<webhook URL>")
            if hidden != message:
                record.msg, record.args = hidden, ()
        return True


_WEBHOOK_URL_FILTER = _HideWebhookUrls()
logging.getLogger("httpx").addFilter(_WEBHOOK_URL_FILTER)


class Alerter:
    """Sends alerts; ``connect`` opens a database connection for cross-process de-duplication."""

    def __init__(
        self,
        *,
        error_webhook: str | None = None,
        critical_webhook: str | None = None,
        dedup_seconds: int = 300,
        connect: Callable[[], object] | None = None,
        timeout_seconds: float = 5.0,
        state_dir: Path | None = None,
    ) -> None:
        self._error_webhook = error_webhook
        self._critical_webhook = critical_webhook
        _WEBHOOK_URL_FILTER.hide(error_webhook, critical_webhook)
        self._dedup_seconds = dedup_seconds
        self._connect = connect
        self._timeout = timeout_seconds
        self._state_dir = state_dir
        self._local_sent: dict[str, float] = {}
        self._lock = threading.Lock()

    def _claim(self, alert_type: str) -> bool:
        """Whether this alert type may be sent now (and, if so, start a new window)."""
        if self._connect is not None:
            try:
                with self._connect() as conn:  # type: ignore[attr-defined]
                    claimed = claim_alert_window(conn, alert_type, window_seconds=self._dedup_seconds)
                    conn.commit()
                    return claimed
            except Exception as exc:  # noqa: BLE001 - alerting must never break the caller
                logger.warning("alert de-duplication fell back to %s: %s",
                               "the state folder" if self._state_dir is not None else "this process only",
                               type(exc).__name__)
        if self._state_dir is not None:
            try:
                return self._claim_file(alert_type)
            except OSError as exc:
                logger.warning("alert de-duplication fell back to this process only: %s", type(exc).__name__)
        with self._lock:
            now = time.monotonic()
            last = self._local_sent.get(alert_type)
            if last is not None and now - last < self._dedup_seconds:
                return False
            self._local_sent[alert_type] = now
            return True

    def _claim_file(self, alert_type: str) -> bool:
        """The window claim on ``<state_dir>/<type>.last-sent``, under an exclusive lock (any process)."""
        self._state_dir.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
        path = self._state_dir / f"{alert_type}.last-sent"  # type: ignore[operator]
        with open(path, "a+", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
            handle.seek(0)
            try:
                last = float(handle.read().strip())
            except ValueError:
                last = None
            now = time.time()
            if last is not None and 0 <= now - last < self._dedup_seconds:
                return False
            handle.seek(0)
            handle.truncate()
            handle.write(f"{now}\n")
            handle.flush()
            return True

    def _post(self, url: str, payload: Mapping) -> None:
        try:
            response = httpx.post(url, json=payload, timeout=self._timeout)
            response.raise_for_status()
        except Exception as exc:  # noqa: BLE001 - a broken webhook must not break the pipeline
            # The URL is a secret (it embeds a token): log the failure, never the address.
            logger.warning("alert webhook failed: %s", type(exc).__name__)

    def send(self, alert: Alert) -> bool:
        """Log the alert and, for error and critical, post it once per dedup window; True if posted."""
        log = logger.critical if alert.level == "critical" else logger.error if alert.level == "error" else logger.warning
        log("%s: %s%s", alert.type, alert.message, f" ({alert.error})" if alert.error else "")
        if alert.level == "warn" or not (self._error_webhook or self._critical_webhook):
            return False
        if not self._claim(alert.type):
            return False
        payload = alert.discord_payload()
        if self._error_webhook:
            self._post(self._error_webhook, payload)
        if alert.level == "critical" and self._critical_webhook:
            self._post(self._critical_webhook, payload)
        return True

    def alert(self, alert_type: str, message: str, *, level: Level = "error", ids: tuple[str, ...] = (),
              error: str | None = None, retry: tuple[int, int] | None = None) -> bool:
        """Build and send an alert in one call."""
        return self.send(Alert(type=alert_type, level=level, message=message, ids=ids, error=error, retry=retry))


NULL_ALERTER = Alerter()
"""An alerter with no webhooks: it only logs."""
