"""The one fake the tests may use: an OpenAI-compatible LLM and embedding server
(:mod:`tests.fakes.openai_server`), reached through the real ``openai`` client."""

__all__: list[str] = []
