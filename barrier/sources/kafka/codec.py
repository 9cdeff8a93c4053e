"""Decoding Kafka keys and values into rows of a declared schema.

Each record becomes one JSON object text (value fields, plus the key columns taken from the
key); Spark's ``from_json`` then types it to the source's declared schema on the executors.
Formats: :class:`JsonFormat`, :class:`StringFormat` (keys), and :class:`AvroFormat`
(with the schema given by the user, and/or the Confluent wire format with a schema
registry).

>>> decoder = RecordDecoder(JsonFormat(), key_columns=("id",))
>>> decoder.decode(b"o-1", b'{"amount": 3}')
'{"amount": 3, "id": "o-1"}'
"""

from __future__ import annotations

import base64
import io
import json
import struct
import threading
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from functools import cached_property
from typing import Any
from uuid import UUID

from lockstep.barrier.sources.kafka.cut import KafkaSourceError

CONFLUENT_MAGIC = 0


class RecordDecodeError(KafkaSourceError):
    """A record's key or value does not decode with the source's format."""


@dataclass(frozen=True)
class JsonFormat:
    """UTF-8 JSON: a value is an object whose fields are columns; a key may be any value."""


@dataclass(frozen=True)
class StringFormat:
    """UTF-8 text, for keys: the text is the (single) key column."""


@dataclass(frozen=True)
class AvroFormat:
    """Avro binary.

    ``schema``: the Avro schema (JSON text or dict) to read with; required unless a
    ``registry_url`` is given. ``registry_url``: a Confluent-compatible schema registry; each
    record's writer schema is fetched by the id in its Confluent wire header (magic byte 0,
    4-byte schema id), and, if ``schema`` is given too, resolved to it. ``confluent``:
    whether payloads carry that header (default: only with a registry).
    """

    schema: str | Mapping[str, Any] | None = None
    registry_url: str | None = None
    confluent: bool | None = None

    @property
    def framed(self) -> bool:
        return self.confluent if self.confluent is not None else self.registry_url is not None

    def __post_init__(self) -> None:
        if self.schema is None and self.registry_url is None:
            raise KafkaSourceError("AvroFormat needs a schema, a registry_url, or both")


Format = JsonFormat | StringFormat | AvroFormat

_registry_cache: dict[tuple[str, int], Any] = {}
_registry_lock = threading.Lock()


def _parse_avro(schema: str | Mapping[str, Any]) -> Any:
    from fastavro import parse_schema

    return parse_schema(json.loads(schema) if isinstance(schema, str) else dict(schema))


def registry_schema(registry_url: str, schema_id: int) -> Any:
    """The parsed writer schema ``schema_id`` of a registry (cached per process)."""
    key = (registry_url.rstrip("/"), schema_id)
    with _registry_lock:
        if key in _registry_cache:
            return _registry_cache[key]
    url = f"{key[0]}/schemas/ids/{schema_id}"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.loads(response.read())
    except OSError as e:
        raise RecordDecodeError(f"schema {schema_id} not available from {url}: {e}") from e
    parsed = _parse_avro(body["schema"])
    with _registry_lock:
        _registry_cache[key] = parsed
    return parsed


class _AvroReader:
    def __init__(self, fmt: AvroFormat) -> None:
        self.fmt = fmt
        self.reader_schema = _parse_avro(fmt.schema) if fmt.schema is not None else None

    def read(self, payload: bytes) -> Any:
        from fastavro import schemaless_reader

        writer = self.reader_schema
        body = payload
        if self.fmt.framed:
            if len(payload) < 5 or payload[0] != CONFLUENT_MAGIC:
                raise RecordDecodeError("Avro payload lacks the Confluent wire header")
            (schema_id,) = struct.unpack(">I", payload[1:5])
            body = payload[5:]
            if self.fmt.registry_url is not None:
                writer = registry_schema(self.fmt.registry_url, schema_id)
        if writer is None:  # framed without a registry, and no schema: refused in AvroFormat
            raise RecordDecodeError("no Avro schema to read the record with")
        reader = self.reader_schema if writer is not self.reader_schema else None
        return schemaless_reader(io.BytesIO(body), writer, reader)


def jsonable(value: Any) -> Any:
    """Avro-decoded Python values as JSON that Spark's ``from_json`` reads back exactly:
    timestamps and dates as ISO text, decimals as text, bytes as base64."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value


@dataclass(frozen=True)
class RecordDecoder:
    """Turns a record's key and value bytes into one JSON object text (None: tombstone).

    Picklable: Spark ships it to the executors, which parse the Avro schemas once per task.
    """

    value_format: Format
    key_format: Format = StringFormat()
    key_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.value_format, StringFormat):
            raise KafkaSourceError("values must be JSON or Avro (StringFormat is for keys)")

    @cached_property
    def _value_avro(self) -> _AvroReader | None:
        fmt = self.value_format
        return _AvroReader(fmt) if isinstance(fmt, AvroFormat) else None

    @cached_property
    def _key_avro(self) -> _AvroReader | None:
        fmt = self.key_format
        return _AvroReader(fmt) if isinstance(fmt, AvroFormat) else None

    def decode(self, key: bytes | None, value: bytes | None) -> str | None:
        if value is None:
            return None
        if self._value_avro is None and not self.key_columns:
            return value.decode("utf-8")  # Spark parses (and checks) it
        row = self._decode_value(value)
        if self.key_columns:
            row.update(self._decode_key(key))
        return json.dumps(row)

    def _decode_value(self, value: bytes) -> dict[str, Any]:
        try:
            if self._value_avro is not None:
                decoded = jsonable(self._value_avro.read(value))
            else:
                decoded = json.loads(value)
        except (ValueError, EOFError, IndexError, struct.error) as e:
            raise RecordDecodeError(f"value does not decode: {e}") from e
        if not isinstance(decoded, dict):
            raise RecordDecodeError(f"value is not an object/record: {decoded!r:.80}")
        return decoded

    def _decode_key(self, key: bytes | None) -> dict[str, Any]:
        if key is None:
            return dict.fromkeys(self.key_columns)
        try:
            if self._key_avro is not None:
                decoded = jsonable(self._key_avro.read(key))
            elif isinstance(self.key_format, JsonFormat):
                decoded = json.loads(key)
            else:
                decoded = key.decode("utf-8")
        except (ValueError, EOFError, IndexError, struct.error) as e:
            raise RecordDecodeError(f"key does not decode: {e}") from e
        if isinstance(decoded, dict):
            return {c: decoded.get(c) for c in self.key_columns}
        if len(self.key_columns) == 1:
            return {self.key_columns[0]: decoded}
        raise RecordDecodeError(
            f"key {decoded!r:.80} is a single value, but the source has key columns "
            f"{list(self.key_columns)} (give a key that is an object/record)"
        )
