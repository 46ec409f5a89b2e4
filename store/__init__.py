"""The store: one SQLite file in WAL mode, written only by the collector, read by the pages.

``store.schema`` (DDL, migrations), ``store.writer`` (StoreWriter, BackgroundWriter, retention),
``store.queries`` (read-only queries), ``python -m store export``.
"""
