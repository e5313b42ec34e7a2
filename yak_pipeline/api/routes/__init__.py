"""One router per resource; :data:`ROUTERS` is what the app includes, in this order."""

from yak_pipeline.api.routes import (
    conflicts,
    context,
    distillations,
    export,
    forget,
    health,
    keys,
    memories,
    metrics,
    profile,
    proxy,
    queue,
    review,
    turns,
    warmth,
)

ROUTERS = (
    memories.router,
    distillations.router,
    context.router,
    profile.router,
    turns.router,
    warmth.router,
    review.router,
    conflicts.router,
    forget.router,
    queue.router,
    export.router,
    keys.router,
    health.router,
    metrics.router,
    proxy.router,
)
