"""The web page at ``/ui``: what Yak remembers for a user, and curating it, server-rendered.

Jinja2 templates and one stylesheet, no script and no build step. Signing in takes an API key
(admin: pick a user; user-scoped: that user only), kept on the server for the browser session
(:mod:`.sessions`). Pages read and act through the same store, recall and forget functions as
the API's routes, with the same scoping, audit rows and metrics (:mod:`.access`, :mod:`.views`,
:mod:`.actions`).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from yak_pipeline.api.ui import actions, sign_in, views
from yak_pipeline.api.ui.access import PREFIX
from yak_pipeline.api.ui.sessions import SessionStore

STATIC_DIR = Path(__file__).parent / "static"


def install_web_page(app: FastAPI) -> None:
    """Serve the page under ``/ui`` (its stylesheet under ``/ui/static``) with a fresh session store."""
    app.state.page_sessions = SessionStore()
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
    for router in (sign_in.router, views.router, actions.router):
        app.include_router(router)
