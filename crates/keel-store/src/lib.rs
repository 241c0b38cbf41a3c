//! Durable event-log stores for Keel threads: SQLite (default), Postgres (scale-out) and in-memory, with one conformance suite.
