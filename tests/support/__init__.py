"""Real parts for the tests: an embedded PostgreSQL, databases, service processes, stand-in
products. Nothing here is a mock: the cluster is the wheel's PostgreSQL 18, each test gets
its own database in it, and the service runs as a separate ``coordinator serve`` process
that the tests start, query over HTTP, and kill with signals. Every service and stand-in a
test starts through :class:`Services` (the ``services`` fixture) is stopped when the test
ends, however it ends.

Tests import what they need from here (``from tests.support import Services``); each
module holds one concern:

* :mod:`~tests.support.paths`: where the workflows and the corpus are;
* :mod:`~tests.support.postgres`: the cluster, its databases and outages, an old PostgreSQL;
* :mod:`~tests.support.rows`: the database from the tests' side (admit, read, put to sleep);
* :mod:`~tests.support.config`: the configurations the tests write;
* :mod:`~tests.support.processes`: ``coordinator`` as a process, ``serve`` as a Service;
* :mod:`~tests.support.standins`: the stand-in products' process and its control routes;
* :mod:`~tests.support.services`: the ``services`` fixture's Services, and what tests read
  of a running service and send it;
* :mod:`~tests.support.tokens`: the tests' secrets, signed requests, auth sections;
* :mod:`~tests.support.network`: free loopback ports, responses read off a raw socket;
* :mod:`~tests.support.waiting`: polling until something holds;
* :mod:`~tests.support.answers`: products' answers for the pure step semantics;
* :mod:`~tests.support.forms`: HTML forms read as a browser sends them;
* :mod:`~tests.support.chaos`: the chaos scenarios' invariants over runs and ledgers;
* :mod:`~tests.support.interleave`: two connections' statements forced into an order;
* :mod:`~tests.support.call_tasks`: the call pool in-process beside a stand-in BReg;
* :mod:`~tests.support.results`: Casework's results delivered, signed or pushed;
* :mod:`~tests.support.callers`: API callers' tokens signed with real keys, policies;
* :mod:`~tests.support.documents`: workflow documents checked, digested, walked;
* :mod:`~tests.support.generated`: workflows made up by Hypothesis.

No test module imports another: what two of them share lives here
(tests/offline/test_layers.py holds that).
"""

from tests.support.answers import breg_record, reply, review_result
from tests.support.call_tasks import (
    HANG,
    LEASE,
    RECORD,
    breg,
    breg_config,
    call_pool,
    claimed_call,
    invocations,
    stay,
)
from tests.support.callers import KEYS, POLICIES, call, jwks, jwt_auth, token
from tests.support.chaos import (
    ASKED,
    ASKING,
    CALLED,
    CASEWORK_POOL,
    HEADER,
    MESSAGING_POOL,
    MUTATIONS,
    SLEPT,
    called_or_asked,
    final_states,
    mutations_seen,
    resent_on_a_guess,
    sealings,
    sent,
    start_runs,
    summary,
    unanswered,
    unanswered_requests,
    wait_answered,
)
from tests.support.config import (
    QUIET,
    bound_to_one,
    connection,
    package,
    refused,
    services_kek,
    write_config,
)
from tests.support.documents import (
    TUTORIAL,
    TUTORIAL_DIGEST,
    check,
    digest_of_yaml,
    edges,
    reachable,
    tutorial_with,
)
from tests.support.forgery import chained, resigned
from tests.support.forms import Form, Forms
from tests.support.generated import dags
from tests.support.interleave import (
    Failing,
    Paused,
    Uncommitted,
    blocked_or_done,
    rival_while_paused,
    rival_while_uncommitted,
)
from tests.support.network import free_port, h11_answer
from tests.support.paths import CORPUS, ROOT, TEST_WORKFLOWS, WORKFLOWS
from tests.support.postgres import (
    PG_BIN,
    Cluster,
    old_postgres,
    old_postgres_bin,
    pg_dump,
    pg_restore,
)
from tests.support.processes import (
    Service,
    coordinator,
    coordinator_on_terminal,
    coordinator_process,
    migrate,
    process_env,
    python_env,
    running,
)
from tests.support.results import deliver, push, pushing, reviews
from tests.support.rows import (
    admit,
    database,
    events,
    put_to_sleep,
    run_state,
    runs_opened,
    sendings,
)
from tests.support.services import (
    Services,
    held_notice,
    issuer_token,
    metrics,
    moved,
    notify_with_oauth2,
    started_by_case_portal,
)
from tests.support.standins import (
    DECISIONS,
    HANG_ONCE,
    StandIns,
    decide,
    new_review,
    stand_ins,
)
from tests.support.tokens import (
    CONSOLE_CLIENT,
    PARAMETERS,
    STAFF_TOKEN,
    STANDIN_TOKEN,
    WEBHOOK_SECRET,
    completion_request,
    delivery_request,
    development_jwt,
    oauth2,
    signed_in,
    signing,
)
from tests.support.waiting import ADMISSION_WAITING, until, wait_for, wait_ready, wait_state

__all__ = [
    "ADMISSION_WAITING",
    "ASKED",
    "ASKING",
    "CALLED",
    "CASEWORK_POOL",
    "CONSOLE_CLIENT",
    "CORPUS",
    "DECISIONS",
    "HANG",
    "HANG_ONCE",
    "HEADER",
    "KEYS",
    "LEASE",
    "MESSAGING_POOL",
    "MUTATIONS",
    "PARAMETERS",
    "PG_BIN",
    "POLICIES",
    "QUIET",
    "RECORD",
    "ROOT",
    "SLEPT",
    "STAFF_TOKEN",
    "STANDIN_TOKEN",
    "TEST_WORKFLOWS",
    "TUTORIAL",
    "TUTORIAL_DIGEST",
    "WEBHOOK_SECRET",
    "WORKFLOWS",
    "Cluster",
    "Failing",
    "Form",
    "Forms",
    "Paused",
    "Service",
    "Services",
    "StandIns",
    "Uncommitted",
    "admit",
    "blocked_or_done",
    "bound_to_one",
    "breg",
    "breg_config",
    "breg_record",
    "call",
    "call_pool",
    "called_or_asked",
    "chained",
    "check",
    "claimed_call",
    "completion_request",
    "connection",
    "coordinator",
    "coordinator_on_terminal",
    "coordinator_process",
    "dags",
    "database",
    "decide",
    "deliver",
    "delivery_request",
    "development_jwt",
    "digest_of_yaml",
    "edges",
    "events",
    "final_states",
    "free_port",
    "h11_answer",
    "held_notice",
    "invocations",
    "issuer_token",
    "jwks",
    "jwt_auth",
    "metrics",
    "migrate",
    "moved",
    "mutations_seen",
    "new_review",
    "notify_with_oauth2",
    "oauth2",
    "old_postgres",
    "old_postgres_bin",
    "package",
    "pg_dump",
    "pg_restore",
    "process_env",
    "push",
    "pushing",
    "put_to_sleep",
    "python_env",
    "reachable",
    "refused",
    "reply",
    "resent_on_a_guess",
    "resigned",
    "review_result",
    "reviews",
    "rival_while_paused",
    "rival_while_uncommitted",
    "run_state",
    "running",
    "runs_opened",
    "sealings",
    "sendings",
    "sent",
    "services_kek",
    "signed_in",
    "signing",
    "stand_ins",
    "start_runs",
    "started_by_case_portal",
    "stay",
    "summary",
    "token",
    "tutorial_with",
    "unanswered",
    "unanswered_requests",
    "until",
    "wait_answered",
    "wait_for",
    "wait_ready",
    "wait_state",
    "write_config",
]
