"""Tests that drive the engine in-process against a real PostgreSQL: the store, named
queries, races forced with two connections, call tasks, the timer service."""
