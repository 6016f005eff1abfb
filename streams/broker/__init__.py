"""Local Apache Kafka broker from Maven Central jars (`memstream broker`).

The package also carries, as package data, the ``pom.xml`` Maven resolves the broker's
jars from and the ``log4j2.properties`` the broker logs with. :mod:`.local` starts, stops
and reports the broker (and re-exports what callers need); :mod:`.config`, :mod:`.jars`,
:mod:`.probe`, :mod:`.process`, :mod:`.logs` and :mod:`.paths` each do one part of it.
"""

__all__: list[str] = []
