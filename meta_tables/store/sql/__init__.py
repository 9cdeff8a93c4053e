"""The SQLAlchemy metadata store: :class:`~.store.SqlMetadataStore` is the transaction
policy; each concern's queries are a module (``protocol``, ``resolve``, ``leases``,
``revision``, ``retention``, ``repair``, ``topology``); ``schema``/``migrations`` the tables,
``engine`` the SQLite/PostgreSQL connection set-up, ``export`` the Arrow export."""
