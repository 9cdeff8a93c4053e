"""The served Iceberg catalog's persistence in the SQL store (the port:
``meta_tables/store/catalog.py``): :class:`~.store.SqlCatalogStore` runs a unit of work in
the store's transactions, :class:`~.session.SqlCatalogSession` holds its statements, one
module per concern (``namespaces``, ``pointers`` for tables and views alike, ``jobs``,
``versions``, ``idempotency``)."""
