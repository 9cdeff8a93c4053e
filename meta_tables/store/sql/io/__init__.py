"""The store's I/O: statements on the DB-API cursor (``cursor``), their PostgreSQL tier
(``postgres``: lists unnested into rows, set-form inserts), and what the protocol reads and
writes, by what it is about: jobs (``jobs``), versions (``versions``), progress
(``progress``)."""
