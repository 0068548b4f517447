"""Tests that need nothing but Python: the checker, expressions, canonical JSON, step
semantics, statement building, the route table, the command line's offline commands."""
