"""The store: one SQLite file in WAL mode, written only by the collector, read by the pages.

``store.tables`` (every table declared once: row classes, SQL types), ``store.schema`` (DDL,
append-only migrations), ``store.ops`` (every write, an operation with ``apply(tx)``),
``store.writer`` (``StoreWriter``, ``BackgroundWriter``), ``store.queries`` (``open_reader`` and
read-only queries returning typed rows), ``store.rows`` (a request between its record and row
forms), ``python -m store export``.
"""
