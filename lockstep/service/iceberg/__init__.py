"""The Iceberg REST catalog that ``lockstep serve`` serves under ``/iceberg`` (issue #15).

Namespaces and table pointers live in the service's own store database; table metadata
files live under the warehouse named by the service's ``[iceberg]`` settings. Stock
clients (pyiceberg ``type=rest``, Spark ``type=rest``, DuckDB's Iceberg extension) talk to
it with Lockstep's bearer tokens. Modules: ``config`` (the settings), ``errors`` (the
Iceberg error model, in one place), ``names`` (identifiers), ``storage`` (the SQL),
``files`` (metadata files), ``commit`` (staging and compare-and-set), ``catalog`` (the
operations), ``routes`` (HTTP), ``mount`` (the sub-application and its front door).
"""
