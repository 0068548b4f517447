"""Fault injection: SIGKILL at crash points, database outages and restarts, under load."""
