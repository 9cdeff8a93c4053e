"""The SQLAlchemy metadata store: :class:`~.store.SqlMetadataStore` is the transaction
policy; the job protocol's store functions are ``protocol/``, how their reads and writes
reach the database (alone, or a group's) ``batching/``, the statements and what they read
``io/``, resolution ``resolution/``; one module per other concern (``leases``,
``revision``, ``retention``, ``repair``, ``topology``, ``heads``, ``wakeups``);
``schema``/``migrations`` the tables, ``engine`` the SQLite/PostgreSQL connection set-up,
``export`` the Arrow export. The layout, room by room: docs/architecture.md."""
