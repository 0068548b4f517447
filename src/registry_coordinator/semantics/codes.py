"""The closed lists a run is described by: its state, why it failed, why it is held.

These codes are part of the product's contract: they appear in run status, in
history, in metrics labels and in the operator runbook. Add one only with its
documentation. Every state, failure and hold in the code is named through these
enums, never as a string literal, so a search for a member finds every place it matters.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """Where a run is. A run moves only forward: the terminal states are final."""

    #: Claimable by a worker now, or held by one that is advancing it.
    RUNNING = "running"
    #: Parked until an instant (``wait-until``) or a product's result (``wait-for``).
    WAITING = "waiting"
    #: Stopped for an operator: Coordinator cannot safely decide (see :class:`HoldCode`).
    HELD = "held"
    #: Reached a ``finish`` step; its outcome and output are recorded.
    FINISHED = "finished"
    #: Ended by a :class:`FailureCode`; nothing is retried.
    FAILED = "failed"
    #: Its deadline passed before it finished (failure code ``deadline-reached``).
    EXPIRED = "expired"
    #: Cancelled by its caller or an operator, with a reason.
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """Whether the run has ended: nothing will change it again."""
        return self in TERMINAL


#: The states a run ends in.
TERMINAL = frozenset({RunState.FINISHED, RunState.FAILED, RunState.EXPIRED, RunState.CANCELLED})


class FailureCode(StrEnum):
    """Why a run ended ``failed`` (or ``expired``). Terminal: nothing is retried."""

    PRODUCT_REFUSED = "product-refused"
    """The product answered 400, 404, 409 or 422: it refused the command as sent."""
    REQUEST_INVALID = "request-invalid"
    """The evaluated call input does not satisfy the operation's request schema."""
    EXPRESSION_ERROR = "expression-error"
    """An expression failed at run time (a missing field, a wrong type, division by zero)."""
    OUTPUT_INVALID = "output-invalid"
    """The finish step's evaluated output does not satisfy its outcome's schema."""
    DEADLINE_REACHED = "deadline-reached"
    """The run's deadline passed before it finished (the run is ``expired``)."""
    ACTION_UNAVAILABLE = "action-unavailable"
    """A BReg action the registry's metadata does not offer to the connection's access
    profile (or describes in a form Coordinator cannot act on): nothing was sent."""
    RESULT_EXPIRED = "result-expired"
    """A wait-for's product answered that the result is no longer retained (Casework's
    410 after the result's ``availableUntil``): the wait cannot end with it."""
    EXTERNAL_INVALID_COMMAND = "external-invalid-command"
    """An external read names a path or query parameter its connection's review does not
    allow (or a query value no reviewed read sends): nothing was sent."""
    EXTERNAL_DESTINATION_REFUSED = "external-destination-refused"
    """An external connection's host resolves to an address no read may reach (link-local,
    where cloud metadata services answer): nothing was sent, not even for a token."""
    EXTERNAL_REDIRECT = "external-redirect"
    """An external read was answered with a redirect, which is never followed: it would
    take the connection's credential and the run's query where nobody reviewed."""
    EXTERNAL_INVALID_RESPONSE = "external-invalid-response"
    """An external read's answer is not strict JSON, exceeds the connection's
    ``responseLimit``, or does not fit its ``responseSchema``: it is not released."""


class HoldCode(StrEnum):
    """Why a run is ``held``: Coordinator cannot safely decide, an operator must."""

    PRODUCT_FORBIDDEN = "product-forbidden"
    """The product answered 401/403: Coordinator's service identity was refused.
    Fix the identity's configuration or the product's policy, then ``retry-same``."""
    OUTCOME_UNKNOWN = "outcome-unknown"
    """A mutation may have reached the product but no usable answer came back
    (timeout, reset, 5xx, or a 4xx other than a refusal, such as 408 or 423).
    ``reconcile`` where a receipt exists, else check the product and ``retry-same``
    or ``cancel``."""
    RESPONSE_INVALID = "response-invalid"
    """A mutation was answered 2xx with a body that breaks the operation's schema or
    cannot be stored (not JSON, NaN, a NUL character, nested too deep): it probably
    took effect, but its result cannot be used. The body is kept on the call's
    execution (sealed), and the detail says why it cannot be used, never what it said."""
    RECEIPT_EXPIRED = "receipt-expired"
    """A resend of a mutation under its original key was answered that the key was spent
    on an original that took effect and that the product's record of its answer has
    expired (``idempotency.expired``): it acted, but its result cannot be had from it.
    Check the effect at the product, then ``cancel``; nothing can be resent."""
    PREPARED_COMMAND_MISMATCH = "prepared-command-mismatch"
    """A prepared command (a BReg action, frozen with the registry revision and action
    contract it was prepared under) was to be sent again, but the registry now offers
    the action under another revision or contract, or not at all: the frozen command no
    longer fits, and whether its first sending took effect is unknown. Check the
    product; ``cancel``, or ``retry-same`` once the registry offers it as prepared."""
    RESULT_CONCEALED = "result-concealed"
    """A wait-for's product answered that it has no result for the key that Coordinator's
    identity may see (Casework's and Messaging's concealing 404): the key is wrong, or
    the connection's identity or profile cannot see it. Fix the configuration, then
    ``retry-same`` reads it again; or ``cancel``."""
    DISPATCH_INTERRUPTED = "dispatch-interrupted"
    """Coordinator stopped (crash or shutdown), or lost its claim on the run in a
    database outage, after sending a mutation and before recording its answer. An
    answer that arrives after another process took the run over is kept with the run,
    and ``reconcile`` uses it."""
    DEFINITION_UNUSABLE = "definition-unusable"
    """The definition the run was admitted under cannot be loaded by this build (the
    detail says why), several times in a row. Run a build that can, then
    ``retry-same``; or ``cancel``."""
    ENGINE_DEFECT = "engine-defect"
    """Coordinator failed at this step with an error of its own (the detail names it):
    the same unexpected error several times in a row, or a statement the database
    refused while recording an answer. Report it; after a fix, ``retry-same`` takes
    the step again (a call resends its sealed request with its key)."""
    DATA_UNOPENABLE = "data-unopenable"
    """The run's sealed data does not open with the configured custody keys (the detail
    names where and the custody code): a value changed or copied from another row in the
    database, or a data key this configuration cannot unwrap. Nothing was sent once it
    was read (a call in flight before is settled as lost: its history says so). Restore
    the value or configure the keys it was sealed under, then ``retry-same``; or
    ``cancel``."""
    RESTORED_REVIEW = "restored-review"
    """The database was restored from a backup that may not know what the run did since
    (a request sent, an answer had): recognised at startup against the high-water mark
    kept outside the database. Check the product for the run's effects, then
    ``retry-same`` with an attestation of what was found, ``reconcile``, or ``cancel``."""
