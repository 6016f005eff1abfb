"""Local Apache Kafka broker from Maven Central jars (`memstream broker`).

The package also carries, as package data, the ``pom.xml`` Maven resolves the broker's
jars from and the ``log4j2.properties`` the broker logs with; :mod:`.local` does the work.
"""

__all__: list[str] = []
