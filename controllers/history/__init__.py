"""The history store: what Muster decided, when and why, kept in PostgreSQL or SQLite."""
