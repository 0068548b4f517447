"""Stand-in BReg: registry records and the registry's immediate actions.

As the real product: every request names an access profile (``accessProfile``); an
unknown one, a missing record and a malformed id all get the same concealed 404. A
record is read as a Registry Record envelope with a strong ``ETag``. The registry's
metadata (``GET /v1/registry``) describes its actions: their declared inputs, which
inputs name a target whose condition token must be fetched first
(``POST /v1/actions/{id}/target-conditions``) and sent back as a precondition, and the
effects they have. An invocation is refused 412 when a condition is stale; answered
with the application's results otherwise; and its key replays that answer for the same
request, and is refused ``idempotency.conflict`` for another. There is no receipt route.

Every record exists (its domain data made from its id), but one whose last group of
digits is :data:`MISSING`; each patch moves its revision on.
"""

from __future__ import annotations

import re
from typing import Any

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.devtools.standins.server import (
    Answer,
    Call,
    Keys,
    Refusal,
    Route,
    StandIn,
    Tokens,
    new_id,
)

#: The access profile Coordinator's connection is granted.
PROFILE = "coordinator"
#: The last group of a record id that names no record.
MISSING = "000000000404"
REVISION = "sha256:" + "7e" * 32
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_ROUTE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")

#: code -> (status, title, detail): BReg's title is the status's reason phrase, and its
#: detail the code's fixed sentence.
PROBLEMS = {
    "action.handler_failed": (
        500,
        "Internal Server Error",
        "The action handler could not produce an accepted result.",
    ),
    "action.refused": (
        422,
        "Unprocessable Entity",
        "The action was refused by a declared business rule.",
    ),
    "authentication.refused": (
        401,
        "Unauthorized",
        "The bearer credential is missing or refused.",
    ),
    "idempotency.conflict": (
        409,
        "Conflict",
        "The idempotency key is bound to another request.",
    ),
    "idempotency.expired": (
        410,
        "Gone",
        "The held response of the idempotency key expired; the key stays spent.",
    ),
    "mutation.conflict": (409, "Conflict", "The mutation conflicts with current state."),
    "precondition.failed": (412, "Precondition Failed", "The mutation precondition failed."),
    "query.invalid": (400, "Bad Request", "The query request is invalid."),
    "request.invalid": (400, "Bad Request", "The request is invalid."),
    "request.timeout": (504, "Gateway Timeout", "The request timed out."),
    "resource.not_found": (404, "Not Found", "The requested resource was not found."),
    "service.unavailable": (
        503,
        "Service Unavailable",
        "The Registry mutation service is unavailable.",
    ),
    "source.unavailable": (503, "Service Unavailable", "The Registry data service is unavailable."),
    "unsupported.media_type": (
        415,
        "Unsupported Media Type",
        "The request media type is not supported.",
    ),
}

#: The registry's immediate actions, as its metadata describes them.
ACTIONS: dict[str, JSON] = {
    "mark-reviewed": {
        "inputs": [
            {
                "id": "target",
                "apiName": "targetId",
                "required": True,
                "nullable": False,
                "classification": "internal",
                "fieldType": {"type": "reference", "target": "application", "onDelete": "restrict"},
            },
            {
                "id": "outcome",
                "apiName": "outcome",
                "required": True,
                "nullable": False,
                "classification": "internal",
                "fieldType": {"type": "string", "minLength": 1, "maxLength": 64},
            },
        ],
        "referenceInputs": [
            {"input": "target", "apiName": "targetId", "targetEntity": "application"}
        ],
        "requiredConditionKeys": ["targetId"],
        "resultEffects": [{"effect": "application", "entity": "application", "operation": "patch"}],
    },
    "register-contact": {
        "inputs": [
            {
                "id": "email",
                "apiName": "email",
                "required": True,
                "nullable": False,
                "classification": "restricted",
                "fieldType": {"type": "string", "minLength": 3, "maxLength": 254},
            },
        ],
        "referenceInputs": [],
        "requiredConditionKeys": [],
        "resultEffects": [{"effect": "contact", "entity": "contact", "operation": "create"}],
    },
}


def _fingerprint(name: str) -> str:
    return "sha256:" + (name.encode().hex() * 64)[:64]


def metadata(profile: str, revision: str = REVISION) -> JSON:
    """The registry's metadata at ``revision`` as it is served to a caller of ``profile``."""
    actions = []
    for name, action in ACTIONS.items():
        conditioned = bool(action["requiredConditionKeys"])
        route = f"/v1/actions/{name}"
        actions.append(
            {
                "id": name,
                "route": route,
                "conditionRoute": f"{route}/target-conditions" if conditioned else None,
                "contractFingerprint": _fingerprint(name),
                "inputMode": "fixed",
                "maximumInputStringBytes": None,
                **action,
                "access": {"selectedProfile": profile},
                "routes": {
                    "invoke": {
                        "method": "POST",
                        "path": route,
                        "operationId": f"actions.{name}.invoke",
                        "requiresIdempotencyKey": True,
                        "inputSchema": f"action-{name}-invoke-input",
                        "responseSchema": f"action-{name}-invoke-response",
                    },
                    "targetConditions": {
                        "method": "POST",
                        "path": f"{route}/target-conditions",
                        "operationId": f"actions.{name}.target_conditions",
                        "requiresIdempotencyKey": False,
                        "inputSchema": f"action-{name}-target-conditions-input",
                        "responseSchema": f"action-{name}-target-conditions-response",
                    }
                    if conditioned
                    else None,
                },
                "bounds": {
                    "maximumTargets": 16,
                    "maximumFieldMutations": 128,
                    "maximumSnapshotBytes": 2097152,
                },
            }
        )
    return {
        "metadataVersion": "1",
        "id": "applications-registry",
        "version": "1",
        "revision": revision,
        "entities": [],
        "operations": [],
        "actions": actions,
    }


class BReg(StandIn):
    product = "breg"
    problem_base = "https://id.registrystack.org/problems/registry-breg/"
    problems = PROBLEMS

    def __init__(self, tokens: Tokens) -> None:
        self.revisions: dict[str, int] = {}
        self.registry_revision = REVISION
        super().__init__(tokens)

    def control(self, name: str, body: Any) -> JSON:
        """``POST /_control/registry {"revision": ...}``: the registry's package moves on
        (a new revision of its metadata), as a deployment does."""
        if name != "registry":
            return None
        self.registry_revision = str(body.get("revision", self.registry_revision))
        return {"revision": self.registry_revision}

    def make_keys(self) -> Keys:
        return Keys("idempotency.conflict")

    def routes(self) -> list[Route]:
        return [
            Route("GET", "/v1/records/{collection}/{recordId}", self.read),
            Route("GET", "/v1/registry", self.registry),
            Route("POST", "/v1/actions/{action}/target-conditions", self.conditions),
            Route("POST", "/v1/actions/{action}", self.invoke, keyed=True),
        ]

    def not_found(self, method: str, path: str) -> Answer:
        return self.problem("resource.not_found")

    def check(self, call: Call, route: Route) -> None:
        if call.query.get("accessProfile") != PROFILE:  # unknown and ungranted alike
            raise Refusal("resource.not_found")

    def _exists(self, record: str) -> bool:
        return bool(_UUID.match(record)) and not record.endswith(MISSING)

    def revision(self, record: str) -> int:
        return self.revisions.get(record, 1)

    async def read(self, call: Call) -> Answer:
        collection, record = call.params["collection"], call.params["recordId"]
        if not _ROUTE.match(collection) or not self._exists(record):
            raise Refusal("resource.not_found")
        revision = self.revision(record)
        domain = {
            "email": f"applicant+{record[:8]}@example.org",
            "name": f"Applicant {record[:8]}",
            "status": "awaiting-review" if revision == 1 else "reviewed",
        }
        body = {
            "data": {
                "recordIdentifier": record,
                "revisionIdentifier": str(revision),
                "domainData": domain,
            },
            "meta": {
                "registryIdentifier": "applications-registry",
                "datasetIdentifier": collection,
                "entityTypeIdentifier": "application",
            },
        }
        headers = {
            "ETag": f'"breg-{record}-r{revision}"',
            "Link": '<https://id.registrystack.org/profiles/registry-record/v1>; rel="profile", '
            '</v1/schemas/application>; rel="describedby"',
        }
        return Answer(200, body, headers)

    async def registry(self, call: Call) -> Answer:
        return Answer(200, metadata(PROFILE, self.registry_revision))

    def _action(self, call: Call) -> JSON:
        action = ACTIONS.get(call.params["action"])
        if action is None:
            raise Refusal("resource.not_found")
        return action

    def _condition(self, record: str) -> str:
        return f'"cond-{record[:8]}-r{self.revision(record)}"'

    async def conditions(self, call: Call) -> Answer:
        action = self._action(call)
        keys = action["requiredConditionKeys"]
        given = call.body.get("input") if isinstance(call.body, dict) else None
        if not isinstance(given, dict) or set(given) != set(keys) or set(call.body) != {"input"}:
            raise Refusal("request.invalid", "send exactly the condition keys as input")
        preconditions = {}
        for key in keys:
            if not isinstance(given[key], str) or not self._exists(given[key]):
                raise Refusal("resource.not_found")
            preconditions[key] = {"ifMatch": self._condition(given[key])}
        return Answer(200, {"preconditions": preconditions})

    async def invoke(self, call: Call) -> Answer:
        action = self._action(call)
        body = call.body
        if not isinstance(body, dict) or set(body) - {"input", "preconditions"}:
            raise Refusal("request.invalid", "the body is {input, preconditions?}")
        given = body.get("input")
        declared = {i["apiName"]: i for i in action["inputs"]}
        if not isinstance(given, dict) or set(given) - set(declared):
            raise Refusal("request.invalid", "input holds only the action's declared inputs")
        for name, spec in declared.items():
            if spec["required"] and not isinstance(given.get(name), str):
                raise Refusal("request.invalid", f"input {name} is required")
        keys = action["requiredConditionKeys"]
        preconditions = body.get("preconditions", {})
        if keys and (not isinstance(preconditions, dict) or set(preconditions) != set(keys)):
            raise Refusal("request.invalid", "send a precondition for every condition key")
        for key in keys:
            target = given[key]
            if not self._exists(target):
                raise Refusal("resource.not_found")
            if preconditions[key].get("ifMatch") != self._condition(target):
                raise Refusal("precondition.failed")
        results = {}
        for effect in action["resultEffects"]:
            if effect["operation"] == "patch":
                target = given[keys[0]]
                self.revisions[target] = self.revision(target) + 1
                results[effect["effect"]] = {
                    "entity": effect["entity"],
                    "recordId": target,
                    "revision": self.revision(target),
                }
            else:
                results[effect["effect"]] = {
                    "entity": effect["entity"],
                    "recordId": new_id(),
                    "revision": 1,
                }
        return Answer(
            200, {"action": call.params["action"], "applicationId": new_id(), "results": results}
        )
