"""Application services: the worker and what it runs (projector, extractor, reflector),
the replay and the extraction retry. They sit on the Kafka side (`memstream.streams`)
and the LanceDB side (`memstream.projections`) and below the interfaces."""
