"""A record from Kafka on its way to an event: the batch decoder with its fast path
(``batches``), the one record path that screens, opens, verifies and decodes
(``codec``), and the bound on what a compressed batch may inflate to
(``inflation_bound``)."""

__all__: list[str] = []
