"""The metadata store: SQLAlchemy schema, store interface and SQL meta views."""
