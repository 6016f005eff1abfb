"""The wire format, as the Kafka side imports it: see :mod:`memstream.codec.wire`."""

from memstream.codec.wire import *  # noqa: F401,F403
from memstream.codec.wire import __all__  # noqa: F401
