"""The memory proxy on HTTP, whichever protocol a chat speaks: where it is mounted, how large a chat
may be, and how the flow's answer becomes a response (with the ids of the memories it recalled)."""

from __future__ import annotations

from typing import Final

from fastapi import Response
from fastapi.responses import StreamingResponse

from yak_pipeline.services.proxy_exchange import ProxyAnswer, ProxyStream

# Chats carry whole conversations and images as data URLs: more room than the API's 1 MiB.
PROXY_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
# Where the API mounts the proxy: OpenAI clients append /chat/completions to a base URL ending in /v1.
PROXY_PREFIX: Final = "/v1"
# The response header naming the memories the proxy put into the prompt: ids, comma-separated
# (empty when none); a distillation's id, or an exchange's for the user's own words.
RECALLED_IDS_HEADER: Final = "X-Yak-Recalled-Ids"


def proxy_response(answer: ProxyAnswer | ProxyStream) -> Response:
    """``answer`` as the HTTP response: a stream relayed unbuffered, a whole body as it is; the recalled
    ids (the ids only, never text) named for the client to show or log when a chat went upstream."""
    recalled = {} if answer.recalled_ids is None else {RECALLED_IDS_HEADER: ",".join(answer.recalled_ids)}
    if isinstance(answer, ProxyStream):
        # No buffering by proxies in front of Yak: tokens must reach the client as they come.
        return StreamingResponse(answer.chunks, media_type=answer.media_type,
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **answer.headers,
                                          **recalled})
    return Response(answer.content, status_code=answer.status_code, media_type=answer.media_type,
                    headers={**answer.headers, **recalled})
