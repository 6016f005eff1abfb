"""Dead letters: publishing a record that cannot be used with its reason and
stage (``publisher``), reading the newest ones back (``reader``) and the reasons'
names (``reasons``)."""

__all__: list[str] = []
