"""``python -m memstream``: the same command line as the ``memstream`` script, for
environments where the script is not on ``PATH`` (and for tests, which run it with
``sys.executable`` so they use the interpreter under test)."""

from __future__ import annotations

from memstream.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    main()
