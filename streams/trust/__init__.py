"""Who wrote a record: the worker's signature on what only the worker may write
(``worker_identity``) and the unsigned past an operator trusts once, explicitly
(``legacy_trust``)."""

__all__: list[str] = []
