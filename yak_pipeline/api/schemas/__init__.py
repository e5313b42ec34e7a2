"""Request and response bodies of the HTTP API (they are the OpenAPI schema), one module per API area.

- :mod:`~yak_pipeline.api.schemas.base` — what every body shares: the request base (unknown fields
  are a 422), the user id, text and exchange-time fields, and ``rows_to``;
- :mod:`~yak_pipeline.api.schemas.memories` — raw memories (``/api/memories``);
- :mod:`~yak_pipeline.api.schemas.recall` — search and the memory block (``/api/distillations/search``,
  ``/api/context``);
- :mod:`~yak_pipeline.api.schemas.distillations` — distillations, their versions and a person's edits;
- :mod:`~yak_pipeline.api.schemas.curation` — the review queue and conflicts;
- :mod:`~yak_pipeline.api.schemas.warmth` — turns and warmth;
- :mod:`~yak_pipeline.api.schemas.profile` — the user's profile;
- :mod:`~yak_pipeline.api.schemas.forget` — explicit forget commands;
- :mod:`~yak_pipeline.api.schemas.operations` — health, the queue and API keys.
"""
