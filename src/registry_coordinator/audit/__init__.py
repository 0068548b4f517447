"""Audit: histories an auditor can check, and the services that keep them checkable.

The checkpointer signs the heads of runs' hash chains; :mod:`histories` verifies
chains and checkpoints and exports one run's bundle for offline checking; retention
archives ended runs as verified bundles before it deletes them. Above the engine:
none of it is on a run's path.
"""
