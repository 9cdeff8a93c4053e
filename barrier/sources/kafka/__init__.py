"""Kafka root source: barrier cuts over Kafka offsets (``pip install lockstep[kafka]``).

The pure cut rule is :mod:`.cut`; planning on a live broker :mod:`.plan`; reading a
persisted cut with Spark :mod:`.read`; record decoding :mod:`.codec`; aiokafka helpers
:mod:`.client`; the source a job declares :mod:`.source`.
"""

from lockstep.barrier.sources.kafka.source import (
    AvroFormat,
    CutHistory,
    CutNotFinalError,
    JsonFormat,
    KafkaSource,
    KafkaSourceError,
    OffsetsUnavailableError,
    RecordDecodeError,
    StringFormat,
    TimestampTypeError,
    bind_root_sources,
)

__all__ = [
    "AvroFormat",
    "CutHistory",
    "CutNotFinalError",
    "JsonFormat",
    "KafkaSource",
    "KafkaSourceError",
    "OffsetsUnavailableError",
    "RecordDecodeError",
    "StringFormat",
    "TimestampTypeError",
    "bind_root_sources",
]
