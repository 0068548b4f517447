"""Stand-in external service: an office directory, read through an external-http connection.

Not a Registry Stack product: the kind of institutional service an operator reviews and
binds to an ``external-http`` connection (``paths: [offices]``, ``queryParameters:
[district]``). It serves its offices under a deployment prefix (``/directory/v2``), as
such services are deployed, so a test can see the prefix kept; a district it does not
know is an empty 404, which a workflow may branch on. It takes a read with or without a
bearer token, and its ledger says which it got, so a test can see that a public read
carries no credential. Redirects, bodies that are not strict JSON and slow answers are
had through the fault rules every stand-in takes.
"""

from __future__ import annotations

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.devtools.standins.server import Answer, Call, Route, StandIn

#: Where the directory is deployed under its host.
PREFIX = "/directory/v2"
#: Its offices, by district.
OFFICES = {
    "north": ["office-north-1", "office-north-2"],
    "south": ["office-south-1"],
}

PROBLEMS = {
    "request.not-found": (404, "Not found", "Not found"),
    "service.unavailable": (503, "Directory unavailable", "Directory unavailable"),
}


class Directory(StandIn):
    product = "external-http"
    problem_base = "https://directory.example/problems/"
    problems = PROBLEMS

    def routes(self) -> list[Route]:
        return [Route("GET", f"{PREFIX}/offices", self.offices, open=True)]

    def noted(self, entry: dict[str, JSON], call: Call) -> None:
        header = call.headers.get("Authorization")
        entry["authorization"] = (
            "none" if header is None else "valid" if self.tokens.valid(header) else "invalid"
        )

    async def offices(self, call: Call) -> Answer:
        district = call.query.get("district")
        if district is None:
            ids = [office for offices in OFFICES.values() for office in offices]
        elif district in OFFICES:
            ids = OFFICES[district]
        else:
            return Answer(404, empty=True)
        return Answer(200, {"items": [{"id": office} for office in ids]})
