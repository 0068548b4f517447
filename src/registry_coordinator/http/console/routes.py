"""The console's route table, and how its refusals are answered: as pages, not JSON.

The table is apart from the API's (``api.ROUTES``, which ``openapi.yaml`` documents): the
console is for people, its answers are HTML, and a refusal is a page with the API's words
and status. A visitor who must sign in is sent to sign in, and back.
"""

from __future__ import annotations

import logging

from quart import Response, request

from registry_coordinator.custody import Unopenable
from registry_coordinator.http.console import actions, pages, signin
from registry_coordinator.http.console.render import asset, html, redirect
from registry_coordinator.http.console.visitors import SignInNeeded, sign_in_location
from registry_coordinator.http.context import Context
from registry_coordinator.http.problems import Problem, data_unopenable
from registry_coordinator.http.requests import RETRY_AFTER
from registry_coordinator.http.routing import Handler, route
from registry_coordinator.store.database import Unavailable

log = logging.getLogger(__name__)


async def assets(context: Context, version: str, name: str) -> Response:
    found = asset(version, name)
    if found is None:
        raise Problem(404, "route.not-found", f"no console asset {name} of version {version}")
    return found


async def not_found(context: Context, rest: str) -> Response:
    raise Problem(404, "route.not-found", f"the console has no page /console/{rest}")


ROUTES = (
    route("/console/", get=pages.held),
    route("/console/runs", get=pages.runs_page),
    route("/console/runs/<run_id>", get=pages.run_page),
    route("/console/runs/<run_id>/<action>", get=actions.ask, post=actions.take),
    route("/console/runs/<run_id>/<action>/review", post=actions.review),
    route("/console/workflows", get=pages.workflows_page),
    route("/console/workflows/<digest>", get=pages.workflow_page),
    route("/console/admission", get=pages.admission_page),
    route("/console/admission/<change>", post=actions.admission_take),
    route("/console/admission/<change>/review", post=actions.admission_review),
    route("/console/admission/workflows/<change>", post=actions.workflow_starts_take),
    route("/console/connections/<name>/<action>", post=actions.connection_take),
    route("/console/approvals/<approval>/<decision>", post=actions.approval_decide),
    route("/console/bulk", get=pages.bulk_page, post=actions.bulk_preview),
    route("/console/bulk/<job>", get=pages.bulk_job_page),
    route("/console/bulk/<job>/<change>", post=actions.bulk_change),
    route("/console/erasures", get=pages.erasure_page, post=actions.erasure_take),
    route("/console/erasures/review", post=actions.erasure_review),
    route("/console/subject-reports", get=pages.subject_report_page, post=actions.subject_report),
    route("/console/subject-reports/extract", post=actions.subject_extract),
    route("/console/health", get=pages.health_page),
    route("/console/sign-in", get=signin.sign_in),
    route("/console/callback", get=signin.callback),
    route("/console/sign-out", post=signin.sign_out),
    route("/console/assets/<version>/<path:name>", get=assets),
    route("/console/<path:rest>", get=not_found, post=not_found),
)


def _refusal(problem: Problem) -> Response:
    response = html("refused.html", problem.status, problem=problem)
    if problem.status == 503:
        response.headers["Retry-After"] = str(RETRY_AFTER)
    return response


def bound(handler: Handler, context: Context) -> Handler:
    """The view Quart calls: ``handler`` given the context, its refusals as pages. What
    nobody meant to raise is a defect: logged with its cause, and a page that says so."""

    async def view(**parameters: str) -> Response:
        try:
            return await handler(context, **parameters)
        except SignInNeeded:
            if request.method == "GET":
                return redirect(sign_in_location())
            return _refusal(
                Problem(
                    403,
                    "console.sign-in-needed",
                    "your session has ended, and nothing was done: sign in again, then "
                    "send it again",
                )
            )
        except Problem as refused:
            return _refusal(refused)
        except Unopenable as error:
            log.error("answered %s %s with 500: %s", request.method, request.path, error)
            return _refusal(data_unopenable(error))
        except Unavailable as error:
            log.warning(
                "answered %s %s with 503: the database is unavailable: %s",
                request.method,
                request.path,
                error,
            )
            return _refusal(
                Problem(
                    503,
                    "service.unavailable",
                    f"the database cannot be reached: reload the page in {RETRY_AFTER} s",
                )
            )
        except Exception:
            log.exception("the console failed to answer %s %s", request.method, request.path)
            return _refusal(
                Problem(
                    500,
                    "service.internal-error",
                    "the console failed to answer (a defect, logged with its cause); what "
                    "an action changed, if anything, is in the run's history",
                )
            )

    return view
