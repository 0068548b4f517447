"""Semantics: what each step does, as pure transitions, and the closed lists of outcomes.

Shared by the engine and the offline test runner (`coordinator test`), so a scenario run
offline follows exactly the rules a run follows in the service. Built on `authoring` only.
"""
