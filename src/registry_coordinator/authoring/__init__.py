"""Authoring: from a workflow's YAML bytes to a checked, pinned artifact, offline.

Reading sources with positions, the workflow format, the product catalog, CEL expressions,
the graph and its checker, canonical JSON and artifacts. Nothing here touches a database,
the network or an event loop: `coordinator check`, `package` and `graph` run on it alone.
"""
