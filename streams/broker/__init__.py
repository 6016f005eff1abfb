"""Local Apache Kafka broker from Maven Central jars (`memstream broker`)."""
