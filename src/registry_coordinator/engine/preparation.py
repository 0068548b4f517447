"""Commands prepared before they are sealed, and checked before they are sent again.

An operation whose descriptor says ``prepare: breg-action`` is not sealed as the
workflow wrote it. With its pool slot and its token in hand, and before anything is
sealed, the call task reads the registry's metadata under the connection's access
profile, chooses the action and checks the input against its declared inputs, fetches
the condition tokens of its targets, and builds the exact body BReg takes
(``{input, preconditions}``); the command is sealed with that body, its key, and the
authority it was prepared under (:mod:`semantics.actions`). These reads cause no
effect: a failure among them leaves nothing sealed, and the run retries, fails or is
held as the answer says. A resend of a sealed command reads the metadata again and
sends the frozen bytes only if the authority still stands; it never fetches new
conditions (the first ones are part of the command).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from urllib.parse import unquote

from registry_coordinator.authoring.canonical import (
    JSON,
    UnusableJson,
    canonical_bytes,
    strict_json,
)
from registry_coordinator.authoring.catalog import Operation
from registry_coordinator.semantics.actions import (
    Action,
    ActionUnavailable,
    conditions_request,
    input_problems,
    preconditions,
    select,
    still_fits,
)
from registry_coordinator.semantics.codes import FailureCode, HoldCode
from registry_coordinator.semantics.steps import (
    Failed,
    Held,
    Reply,
    ReplyKind,
    Request,
    Retry,
    Transition,
    bind,
    detail,
    said_of,
)

#: Sends one read of the preparation with the call's token and pool slot.
Send = Callable[[Request], Awaitable[Reply]]


@dataclass(frozen=True)
class Prepared:
    """The command to seal, and the authority it was prepared under."""

    request: Request
    binding: dict[str, JSON]


@dataclass(frozen=True)
class Preparer:
    """Prepares one call of ``operation`` on a connection with ``parameters``."""

    operation: Operation
    parameters: Mapping[str, JSON]
    send: Send
    retry_at: datetime  # when a preparation that could not be made is tried again

    @property
    def profile(self) -> str:
        return str(self.parameters.get("accessProfile", ""))

    async def prepare(self, request: Request) -> Prepared | Transition:
        """The sealed-to-be command for ``request`` (bound, with the workflow's input as
        its body); or, when it cannot be prepared, what becomes of the run."""
        action_id = unquote(request.target.split("?", 1)[0].rsplit("/", 1)[-1])
        body = strict_json(request.body or b"{}")
        given = body.get("input") if isinstance(body, dict) else None
        read = await self._action(action_id)
        if not isinstance(read, Action):
            return read
        problems = input_problems(read, given)
        if problems:
            return Failed(
                FailureCode.REQUEST_INVALID,
                detail(
                    f"input for action {action_id} does not fit its declared inputs: "
                    + "; ".join(problems)
                ),
            )
        assert isinstance(given, dict)
        sent: dict[str, JSON] = {"input": given}
        if read.condition_keys:
            target = f"{read.route}/target-conditions"
            asked = bind(
                self.operation,
                Request("POST", target, canonical_bytes(conditions_request(read, given)), None),
                self.parameters,
            )
            answer = await self._json(asked, "the target conditions", FailureCode.PRODUCT_REFUSED)
            if not isinstance(answer, _Read):
                return answer
            try:
                sent["preconditions"] = preconditions(read, answer.body)
            except ActionUnavailable as exc:
                return Failed(FailureCode.ACTION_UNAVAILABLE, detail(str(exc)))
        return Prepared(replace(request, body=canonical_bytes(sent)), read.binding(self.profile))

    async def recheck(self, request: Request, frozen: Mapping[str, JSON]) -> Transition | None:
        """None when the command frozen under ``frozen`` may be sent again as it is;
        otherwise what becomes of the run (the frozen command is never changed)."""
        read = await self._action(str(frozen.get("action", "")))
        if isinstance(read, Failed):  # no longer offered as it was: the command cannot go
            return Held(HoldCode.PREPARED_COMMAND_MISMATCH, read.detail)
        if not isinstance(read, Action):
            return read
        moved = still_fits(frozen, read, self.profile)
        if moved is None:
            return None
        return Held(
            HoldCode.PREPARED_COMMAND_MISMATCH,
            detail(f"the action's contract changed since the command was prepared: {moved}"),
        )

    async def _action(self, action_id: str) -> Action | Transition:
        registry = bind(self.operation, Request("GET", "/v1/registry", None, None), self.parameters)
        answer = await self._json(
            registry, "the registry's metadata", FailureCode.ACTION_UNAVAILABLE
        )
        if not isinstance(answer, _Read):
            return answer
        try:
            return select(answer.body, action_id, self.profile)
        except ActionUnavailable as exc:
            return Failed(FailureCode.ACTION_UNAVAILABLE, detail(str(exc)))

    async def _json(self, request: Request, what: str, missing: FailureCode) -> _Read | Transition:
        """A preparation read's JSON answer, or what its failure makes of the run: read
        again later when the product did not answer or asked to wait, held when it
        refused Coordinator's identity, failed when it refused the read (``missing`` for a
        404: BReg conceals what a profile may not see)."""
        reply = await self.send(request)
        if reply.kind is not ReplyKind.RESPONSE or reply.status is None:
            return Retry(self.retry_at, detail(f"{what} could not be read: {reply.detail}"))
        status = reply.status
        said = said_of(status, reply.body)
        if status in (408, 429) or status >= 500:
            return Retry(self.retry_at, detail(f"{what} could not be read: {status}"))
        if status in (401, 403):
            return Held(HoldCode.PRODUCT_FORBIDDEN, detail(f"{what}: {said}"))
        if status != 200:
            code = missing if status == 404 else FailureCode.PRODUCT_REFUSED
            return Failed(code, detail(f"{what} answered {said}"))
        try:
            return _Read(strict_json(reply.body))
        except UnusableJson as exc:
            return Failed(FailureCode.ACTION_UNAVAILABLE, detail(f"{what} is not JSON: {exc}"))


@dataclass(frozen=True)
class _Read:
    body: JSON
