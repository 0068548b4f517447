"""BReg's immediate actions as its metadata describes them: choosing one, checking input.

A BReg action is not sent as the workflow wrote it. Its contract is read first from the
registry's metadata (``GET /v1/registry`` under the connection's access profile): the
action must be offered to that profile, its declared inputs say what the input may
hold, and the inputs that name a target to be patched need that target's condition
token (``POST /v1/actions/{id}/target-conditions``), sent back as a precondition. The
command is then frozen — its body, its key, and the authority it was prepared under
(the registry's revision and the action's contract fingerprint) — and a resend checks
that authority still stands before it sends the frozen bytes again
(``prepared-command-mismatch`` otherwise), as the real Rust coordinator's
``breg_action.rs`` does.

Pure: what is read is passed in, so what a metadata document or an input means is
tested without a product (``tests/offline/test_actions.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.errors import CoordinatorError

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
#: A condition token: an entity tag of visible ASCII but ``"`` inside its quotes.
_CONDITION = re.compile(r'^"[!#-~]{1,254}"$')
_TIMESTAMP = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$"
)
_DECIMAL = re.compile(r"^-?(0|[1-9][0-9]*)(\.([0-9]+))?$")
#: The bounds of BReg's int64 inputs.
_INT64 = range(-(2**63), 2**63)
#: The longest condition token BReg's client takes.
_CONDITION_BYTES = 256


class ActionUnavailable(CoordinatorError):
    """The registry's metadata offers no such action to this connection's profile, or
    describes it in a form Coordinator cannot act on."""


@dataclass(frozen=True)
class Declared:
    """One declared input of an action."""

    name: str  # its API name, as the input holds it
    field_type: Mapping[str, Any]
    required: bool
    nullable: bool


@dataclass(frozen=True)
class Action:
    """An action as the metadata offers it to one access profile."""

    id: str
    route: str
    condition_route: str | None
    fingerprint: str  # the action's contract fingerprint
    registry_revision: str  # the revision of the registry's metadata it was read from
    inputs: Mapping[str, Declared]
    condition_keys: tuple[str, ...]
    #: The longest string an input may hold, in UTF-8 bytes, if the action bounds it.
    string_bytes: int | None = None

    def binding(self, profile: str) -> dict[str, JSON]:
        """The authority a command is prepared under, frozen with it and checked before a
        resend: the same registry revision, action, profile and contract."""
        return {
            "action": self.id,
            "accessProfile": profile,
            "registryRevision": self.registry_revision,
            "contractFingerprint": self.fingerprint,
        }


def select(metadata: JSON, action: str, profile: str) -> Action:
    """The action ``action`` of a registry metadata document, as offered to ``profile``;
    :class:`ActionUnavailable` saying why it cannot be used."""
    if not isinstance(metadata, dict) or metadata.get("metadataVersion") != "1":
        raise ActionUnavailable("the registry's metadata is not Registry Metadata version 1")
    revision = metadata.get("revision")
    if not isinstance(revision, str) or not revision.startswith("sha256:"):
        raise ActionUnavailable("the registry's metadata names no revision")
    entries = metadata.get("actions") or []
    entry = next((a for a in entries if isinstance(a, dict) and a.get("id") == action), None)
    if entry is None:
        raise ActionUnavailable(f"the registry offers no action {action!r} to profile {profile}")
    access = entry.get("access")
    if not isinstance(access, dict) or access.get("selectedProfile") != profile:
        raise ActionUnavailable(f"action {action} is not offered to profile {profile}")
    route = f"/v1/actions/{action}"
    routes = entry.get("routes") if isinstance(entry.get("routes"), dict) else {}
    invoke = routes.get("invoke") if isinstance(routes, dict) else None
    if entry.get("route") != route or not isinstance(invoke, dict) or invoke.get("path") != route:
        raise ActionUnavailable(f"action {action} is not invoked at {route}")
    keys = entry.get("requiredConditionKeys")
    condition_route = entry.get("conditionRoute")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ActionUnavailable(f"action {action} names no condition keys")
    if keys and condition_route != f"{route}/target-conditions":
        raise ActionUnavailable(f"action {action} has condition keys but no condition route")
    fingerprint = entry.get("contractFingerprint")
    if not isinstance(fingerprint, str) or not fingerprint.startswith("sha256:"):
        raise ActionUnavailable(f"action {action} has no contract fingerprint")
    mode = entry.get("inputMode")
    if mode not in ("fixed", "handler"):
        raise ActionUnavailable(f"action {action} takes its input in a mode Coordinator lacks")
    declared = {}
    for item in entry.get("inputs") or []:
        if not isinstance(item, dict) or not isinstance(item.get("apiName"), str):
            raise ActionUnavailable(f"action {action} declares an input without its name")
        required, nullable = item.get("required"), item.get("nullable")
        # A fixed action's inputs are never null; a handler's are null exactly when optional.
        if not isinstance(required, bool) or nullable != (mode == "handler" and not required):
            raise ActionUnavailable(f"action {action} declares input {item['apiName']} unclearly")
        field_type = item.get("fieldType")
        declared[item["apiName"]] = Declared(
            item["apiName"], field_type if isinstance(field_type, dict) else {}, required, nullable
        )
    references = {
        r.get("apiName")
        for r in entry.get("referenceInputs") or []
        if isinstance(r, dict) and isinstance(r.get("apiName"), str)
    }
    for key in keys:
        spec = declared.get(key)
        if spec is None or not spec.required or spec.nullable:
            raise ActionUnavailable(f"action {action}'s condition key {key} is no required input")
        if key not in references or spec.field_type.get("type") != "reference":
            raise ActionUnavailable(f"action {action}'s condition key {key} is no reference input")
    bound = entry.get("maximumInputStringBytes")
    return Action(
        action,
        route,
        condition_route if keys else None,
        fingerprint,
        revision,
        declared,
        tuple(keys),
        bound if isinstance(bound, int) and not isinstance(bound, bool) else None,
    )


def input_problems(action: Action, given: JSON) -> list[str]:
    """Why ``given`` is not an input ``action`` takes: unknown names, missing required
    inputs, nulls where none may be, values of another type than declared."""
    if not isinstance(given, dict):
        return ["the action's input must be an object of its declared inputs"]
    problems = [
        f"{name} is not an input of {action.id}" for name in sorted(set(given) - set(action.inputs))
    ]
    for name, spec in sorted(action.inputs.items()):
        if name not in given:
            if spec.required:
                problems.append(f"{name} is required")
            continue
        value = given[name]
        if value is None:
            if not spec.nullable:
                problems.append(f"{name} may not be null")
            continue
        too_long = action.string_bytes is not None and isinstance(value, str)
        if too_long and len(value.encode()) > (action.string_bytes or 0):
            problems.append(f"{name} must be at most {action.string_bytes} bytes")
            continue
        wrong = _type_problem(spec.field_type, value)
        if wrong:
            problems.append(f"{name} {wrong}")
    return problems


def _type_problem(field_type: Mapping[str, Any], value: JSON) -> str | None:
    """Why ``value`` is not of the declared field type, as BReg's client judges it before
    anything is sent (None when it is, or when the type is one BReg checks itself:
    structured values, points)."""
    kind = field_type.get("type")
    if kind == "string":
        high, low = field_type.get("maxLength"), field_type.get("minLength", 0)
        if not isinstance(value, str) or not isinstance(high, int):
            return "must be a string" if isinstance(high, int) else "has no declared maximum"
        if not low <= len(value) <= high:
            return f"must be {low} to {high} characters"
    elif kind == "text":
        high = field_type.get("maxLength")
        if not isinstance(value, str) or not isinstance(high, int) or len(value) > high:
            return f"must be a text of at most {high} characters"
    elif kind == "boolean" and not isinstance(value, bool):
        return "must be true or false"
    elif kind == "int64" and (
        isinstance(value, bool) or not isinstance(value, int) or value not in _INT64
    ):
        return "must be a whole number of 64 bits"
    elif kind in ("uuid", "reference") and not (isinstance(value, str) and _UUID.match(value)):
        return "must be a canonical lowercase UUID"
    elif kind == "date" and not (isinstance(value, str) and _calendar_date(value)):
        return "must be a date of the calendar, YYYY-MM-DD"
    elif kind == "timestamp" and not (isinstance(value, str) and _instant(value)):
        return "must be an RFC 3339 timestamp"
    elif kind == "decimal":
        return _decimal_problem(field_type, value)
    elif kind == "vocabulary-code" and value not in (field_type.get("values") or []):
        return "must be one of the vocabulary's values"
    elif kind not in (
        "string",
        "text",
        "boolean",
        "int64",
        "uuid",
        "reference",
        "date",
        "timestamp",
        "vocabulary-code",
        "crs84-point",
        "structured",
    ):
        return f"is of a field type Coordinator does not know ({kind!r})"
    return None


def _calendar_date(text: str) -> bool:
    if not _DATE.match(text):
        return False
    try:
        return 1 <= date.fromisoformat(text).year <= 9999
    except ValueError:
        return False


def _instant(text: str) -> bool:
    if not _TIMESTAMP.match(text):
        return False
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return True


def _scaled(text: JSON, precision: int, scale: int) -> int | None:
    """A decimal written as a string, as an integer of ``scale`` fraction digits; None
    unless it has exactly that many and at most ``precision - scale`` integer digits."""
    if not isinstance(text, str) or not 1 <= precision <= 38 or not 0 <= scale <= precision:
        return None
    found = _DECIMAL.match(text)
    if found is None or len(found[3] or "") != scale or (scale == 0 and "." in text):
        return None
    integer = found[1]
    if integer != "0" and len(integer) > precision - scale:
        return None
    digits = int(integer + (found[3] or ""))
    if text.startswith("-") and digits == 0:
        return None
    return -digits if text.startswith("-") else digits


def _decimal_problem(field_type: Mapping[str, Any], value: JSON) -> str | None:
    precision, scale = field_type.get("precision"), field_type.get("scale")
    if not isinstance(precision, int) or not isinstance(scale, int):
        return "has no declared precision and scale"
    scaled = _scaled(value, precision, scale)
    if scaled is None:
        return f"must be a decimal string of {scale} fraction digits and precision {precision}"
    for bound, lower in (("minimum", True), ("maximum", False)):
        if bound not in field_type:
            continue
        limit = _scaled(field_type[bound], precision, scale)
        if limit is None or (scaled < limit if lower else scaled > limit):
            return f"must be within the declared {bound}"
    return None


def conditions_request(action: Action, given: Mapping[str, JSON]) -> JSON:
    """The body that asks for the condition tokens of the action's targets."""
    return {"input": {key: given[key] for key in action.condition_keys}}


def preconditions(action: Action, answer: JSON) -> dict[str, JSON]:
    """The preconditions of a target-conditions answer: one ``{ifMatch}`` for each of the
    action's condition keys, no more; :class:`ActionUnavailable` if it is not that."""
    closed = isinstance(answer, dict) and set(answer) == {"preconditions"}
    found = answer.get("preconditions") if closed and isinstance(answer, dict) else None
    if not isinstance(found, dict) or set(found) != set(action.condition_keys):
        raise ActionUnavailable(
            f"the target conditions of {action.id} do not name exactly its condition keys"
        )
    for key, value in found.items():
        token = value.get("ifMatch") if isinstance(value, dict) and len(value) == 1 else None
        if not isinstance(token, str) or not _CONDITION.match(token):
            raise ActionUnavailable(f"the condition of {key} is not a quoted token")
    return found


def still_fits(frozen: Mapping[str, JSON], action: Action, profile: str) -> str | None:
    """Why a command frozen under ``frozen`` no longer fits the action as the registry now
    offers it (None while it does)."""
    now = action.binding(profile)
    moved = [name for name in sorted(now) if frozen.get(name) != now[name]]
    if not moved:
        return None
    return ", ".join(f"{name} was {frozen.get(name)!r}, is {now[name]!r}" for name in moved)
