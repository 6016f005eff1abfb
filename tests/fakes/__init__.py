"""The one fake the tests may use: an OpenAI-compatible LLM and embedding server
(:mod:`memstream.bench.openai_fake`, offered to tests with a pytest fixture by
:mod:`tests.fakes.openai_server`), reached through the real ``openai`` client."""

__all__: list[str] = []
