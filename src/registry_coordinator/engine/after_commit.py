"""What follows every commit of a run's steps, whichever path made it.

Four paths commit steps: a worker's step loop, a call task recording an answer (or a
look at a receipt), a call task recording a result read, and the timer's batches of
sleepers. Each commit is followed by the same things, in this order, here and nowhere
else, so a reader never has to wonder which path's differences matter (an operator's
cancel, committed by the HTTP layer outside any step, has :meth:`AfterCommit.cancelled`):

1. the steps' spans: the worker's step span, which is current while it decides and
   commits, says how the step ended; on the other paths the committed steps get spans
   of their own (at the attempt the call was sent at);
2. metrics: each transition counted by step type, and the run's end by state and outcome;
3. the log line an operator needs: a run that failed, expired or was held;
4. the listener told that a run ended here (the checkpointer, which signs ended runs'
   heads soon after), once per commit that ended one;
5. the timer told when the run falls due again later (a retry, a wait-until, a poll),
   unless it is already held to go on at once. The timer's own batches have no timer to
   tell: the timer looks at the database after every burst, which is how it learns of
   the next wait-until a batch committed.

Nothing here touches the database or can fail a run: it runs after the commit, outside
any transaction, so a crash between the commit and these leaves only a metric uncounted
or a span unwritten, and the periodic scans (the timer's sweep, the checkpointer's) find
what was not told.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from registry_coordinator.authoring.definition import Definition
from registry_coordinator.observability import logs, tracing
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.semantics.codes import TERMINAL, RunState
from registry_coordinator.store import Committed


class Scheduler(Protocol):
    """The timer, as far as a commit tells it anything."""

    def scheduled(self, seconds: float) -> None: ...


def _nobody() -> None:
    """No one listens for runs' ends (tools that commit steps outside the service)."""


@dataclass(frozen=True)
class AfterCommit:
    """Told of every commit: ``metrics`` counts it, ``ended`` hears of a run that ended,
    ``timer`` (None in the timer's own batches) of a run due again later."""

    metrics: Metrics
    ended: Callable[[], None] = _nobody
    timer: Scheduler | None = None

    def telling(self, timer: Scheduler) -> AfterCommit:
        """The same, telling ``timer`` of runs due again later."""
        return replace(self, timer=timer)

    def __call__(
        self,
        definition: Definition | None,
        committed: Committed,
        *,
        attempt: int = 0,
        step: tracing.StepSpan | None = None,
    ) -> None:
        """After ``committed``: ``definition`` is None for a run expired without its
        (unloadable) definition; ``step`` is the worker's span for the step, else the
        steps get spans of their own at ``attempt``."""
        if step is not None:
            step.committed(committed)
        elif definition is not None:
            tracing.committed(definition, committed, attempt)
        self.metrics.committed(definition, committed)
        logs.transitions(committed, committed.run.id)
        if committed.run.state in TERMINAL:
            self.ended()
        if self.timer is not None and committed.due_at is not None and not committed.held:
            self.timer.scheduled((committed.due_at - committed.run.now()).total_seconds())

    def cancelled(self, workflow: str) -> None:
        """After an operator's cancel committed, outside any step: the end is counted and
        heard of as a step's is (no line to log: the operator's action is in the run's
        history, and nothing is due)."""
        self.metrics.ended(workflow, RunState.CANCELLED, "")
        self.ended()
