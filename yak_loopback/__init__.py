"""Loopback model servers on 127.0.0.1 with scripted answers, speaking OpenAI's protocol
(:mod:`yak_loopback.openai_server`) and Anthropic's Messages API (:mod:`yak_loopback.anthropic_server`).

The tests and the benchmarks (``bench/``) run Yak against them, so nothing in the HTTP path is
mocked and no real model is needed. Yak itself never imports this package.
"""
