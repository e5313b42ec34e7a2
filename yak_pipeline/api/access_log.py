"""uvicorn's access log: off unless ``YAK_ACCESS_LOG`` turns it on, and then without query strings.

A request line can hold private text: ``GET /ui/u/sam/search?q=what+should+I+cook+tonight%3F``
(issue 35). With the log on, each line keeps the method, the path and the status; the query
string goes.
"""

from __future__ import annotations

import logging
from typing import Any

ACCESS_LOGGER = "uvicorn.access"


class DropQueryStrings(logging.Filter):
    """Cut the query string from uvicorn's access-log records (their third argument is the path)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keep the record, with its path shortened to before ``?``."""
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], args[2].split("?", 1)[0], *args[3:])
        return True


def uvicorn_log_options(access_log: bool) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.run`` for logging: access lines only when asked for.

    The filter is installed on uvicorn's access logger whenever lines are on, so no way of
    turning them on (this setting, a log config) logs a query string.
    """
    if access_log:
        logger = logging.getLogger(ACCESS_LOGGER)
        if not any(isinstance(f, DropQueryStrings) for f in logger.filters):
            logger.addFilter(DropQueryStrings())
    return {"log_level": "info", "access_log": access_log}
