"""The codec: the one place where events meet bytes and rows.

* :mod:`memstream.codec.wire`: an event to a Kafka record and back (the general path,
  through ``memstream.domain.events.parse_event``, the only place that upcasts);
* :mod:`memstream.codec.values`: an event as flat plain values, the shape every
  projection row is built from;
* :mod:`memstream.codec.fast_decode`: a msgspec reader *derived* from the event models
  at import, which gives the same values as the general path for canonical records,
  and ``None`` for anything it is unsure of;
* :mod:`memstream.codec.batch`: fast-path memories of a batch, column-friendly.

It depends only on ``memstream.domain``: both the Kafka side (``memstream.streams``)
and the LanceDB side (``memstream.projections``) build on it.
"""
