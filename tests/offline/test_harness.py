"""The test harness's own promises, the ones a test relies on without seeing them."""

from __future__ import annotations

import pytest

from tests.support import wait_state


def test_waiting_for_a_state_no_run_has_fails_at_once_naming_it() -> None:
    """A misspelled state would only wait out the timeout and blame the service: it is
    refused before the database is asked anything (this one names none it could reach)."""
    with pytest.raises(ValueError, match="finshed"):
        wait_state("postgresql://nobody@/nowhere?host=/nonexistent", "run", "finshed")
