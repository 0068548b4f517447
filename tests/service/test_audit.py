"""`coordinator audit` against a real service's database: counts when every history holds,
the run and event where one was changed in SQL; signed checkpoints that catch a history
rewritten with every hash recomputed; and bundles exported for checking offline."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

from registry_coordinator.semantics.chain import canonical, parse
from registry_coordinator.semantics.checkpoints import Leaf, sign, signing_key
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import sync_connection
from tests.support import Services, coordinator, events, signing, wait_for, wait_state

NOTIFY: dict[str, tuple[str, dict[str, str]]] = {"notices": ("messaging", {})}

#: Every event of a run hashed again after a change, as an administrator who knows the
#: chain's rule would (its functions are in the schema), with the triggers off.
RECOMPUTE = """
DO $$
DECLARE
    e record;
    previous bytea;
BEGIN
    FOR e IN SELECT * FROM run_events WHERE run_id = '{run}' ORDER BY seq LOOP
        previous := event_hash(previous, e.run_id, e.seq, e.at, e.kind, e.step, e.actor,
                               e.detail);
        UPDATE run_events SET hash = previous WHERE run_id = e.run_id AND seq = e.seq;
    END LOOP;
END;
$$
"""


def _as_administrator(dsn: str, *statements: str) -> None:
    with sync_connection(dsn) as conn:
        conn.execute("SET session_replication_role = replica")
        for statement in statements:
            conn.execute(statement)


def _finished(dsn: str, service: object, count: int) -> list[str]:
    runs = [
        service.start_run("notify", {"email": f"{n}@example.org"})  # type: ignore[attr-defined]
        for n in range(count)
    ]
    for run in runs:
        wait_state(dsn, run, RunState.FINISHED)
    return runs


def _signed(dsn: str, runs: list[str]) -> None:
    """Until a checkpoint signed each run's final head (made soon after runs end)."""
    wait_for(
        dsn,
        "SELECT count(*) FROM runs r WHERE r.id = ANY(%s::uuid[]) AND r.seq = "
        "(SELECT max(seq) FROM audit_leaves l WHERE l.run_id = r.id)",
        len(runs),
        params=(runs,),
    )


def test_audit_verify_counts_what_holds_and_names_what_was_changed(
    dsn: str, services: Services
) -> None:
    service, _ = services.deploy(["notify"], NOTIFY)
    runs = _finished(dsn, service, 2)
    written = sum(len(events(dsn, run)) for run in runs)
    history = service.history(runs[0])
    assert service.status(runs[0])["head"] == history[-1]["hash"]  # the API shows the head
    assert len({event["hash"] for event in history}) == len(history)
    status = coordinator("runs", "status", runs[0], "--url", service.url)
    assert f"  head      {history[-1]['hash']} (its history's hash chain)" in status.stdout
    holds = coordinator("audit", "verify", "--config", service.config)
    assert holds.returncode == 0, holds.stderr
    assert holds.stdout == (
        f"verified 2 runs, {written} events, 0 signed heads, 0 checkpoints: "
        "every history holds its chain and its signed heads\n"
    )
    assert "checkpoint signatures were not checked" in holds.stderr  # no key, no checkpoints

    _as_administrator(  # an administrator edits a row, triggers off
        dsn, f"UPDATE run_events SET actor = 'someone else' WHERE run_id = '{runs[1]}' AND seq = 2"
    )
    broken = coordinator("audit", "verify", "--config", service.config)
    assert broken.returncode == 1
    assert broken.stdout == f"run {runs[1]}: event 2: its hash does not match what it holds\n"
    assert "the history does not hold" in broken.stderr
    one = coordinator("audit", "verify", "--config", service.config, "--run", runs[0])
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith("verified 1 runs, ")
    nobody = coordinator("audit", "verify", "--config", service.config, "--run", str(uuid.uuid4()))
    assert nobody.returncode == 1
    assert "no run" in nobody.stderr
    bad = coordinator("audit", "verify", "--config", service.config, "--since", "yesterday")
    assert bad.returncode == 2
    assert "--since 'yesterday' is not an RFC 3339 instant" in bad.stderr
    unsigned = coordinator("audit", "export", "--config", service.config, "--run", runs[0],
                           "--out", services.directory / "b.json")  # fmt: skip
    assert unsigned.returncode == 2
    assert "no audit signingKey" in unsigned.stderr


def _resign(dsn: str, key_file: Path) -> None:
    """What an administrator holding the signing key could do: every leaf made to hold
    its run's head as it now stands, and every checkpoint signed again in order."""
    key = signing_key(key_file.read_text())
    with sync_connection(dsn) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "UPDATE audit_leaves l SET head = e.hash FROM run_events e "
            "WHERE e.run_id = l.run_id AND e.seq = l.seq"
        )
        previous = None
        for c in conn.execute(
            "SELECT number, rfc3339(at) AS at FROM audit_checkpoints ORDER BY number"
        ).fetchall():
            rows = conn.execute(
                "SELECT run_id::text AS run, seq, head FROM audit_leaves WHERE checkpoint = %s "
                "ORDER BY position",
                (c["number"],),
            ).fetchall()
            leaves = [Leaf(r["run"], r["seq"], bytes(r["head"])) for r in rows]
            made = sign(key, c["number"], c["at"], previous, leaves)
            conn.execute(
                "UPDATE audit_checkpoints SET previous = %s, root = %s, key = %s, "
                "signature = %s WHERE number = %s",
                (made.previous, made.root, made.key, made.signature, made.number),
            )
            previous = made.digest()


def test_a_history_rewritten_with_every_hash_recomputed_is_caught_by_the_signed_checkpoint(
    dsn: str, services: Services
) -> None:
    keys = services.directory / "keys"
    service, _ = services.deploy(["notify"], NOTIFY, extra=signing(keys))
    runs = _finished(dsn, service, 3)
    _signed(dsn, runs)
    metrics = service.http.get("/metrics").text
    heads = re.search(r"^coordinator_checkpoint_heads_total (\S+)$", metrics, re.MULTILINE)
    assert heads is not None and float(heads[1]) >= 3, metrics  # each run's last head, at least
    holds = coordinator("audit", "verify", "--config", service.config)
    assert holds.returncode == 0, holds.stdout + holds.stderr
    assert "every history holds its chain and its signed heads" in holds.stdout
    kept = services.directory / "kept-checkpoint.json"
    copy = coordinator("audit", "checkpoint", "--config", service.config, "--out", kept)
    assert copy.returncode == 0, copy.stderr
    number = parse(kept.read_bytes())["number"]

    victim = runs[1]
    _as_administrator(
        dsn,
        f"UPDATE run_events SET actor = 'someone else' WHERE run_id = '{victim}' AND seq = 2",
        RECOMPUTE.format(run=victim),
    )
    alone = coordinator("audit", "verify", "--config", service.config, "--run", victim)
    assert alone.returncode == 1  # the chain holds again, but not the head that was signed
    assert re.fullmatch(
        f"run {victim}: event \\d+: its hash is not the one checkpoint \\d+ signed\n",
        alone.stdout,
    ), alone.stdout

    _as_administrator(  # the leaves too: then the checkpoint's root no longer holds
        dsn,
        "UPDATE audit_leaves l SET head = e.hash FROM run_events e "
        f"WHERE e.run_id = l.run_id AND e.seq = l.seq AND l.run_id = '{victim}'",
    )
    leaves = coordinator("audit", "verify", "--config", service.config)
    assert leaves.returncode == 1
    assert "its leaves do not give its signed root" in leaves.stdout

    other = signing(services.directory / "other")  # a key of the administrator's own
    _resign(dsn, Path(other["audit"]["signingKey"].removeprefix("file:")))
    foreign = coordinator("audit", "verify", "--config", service.config)
    assert foreign.returncode == 1
    assert "not the one given" in foreign.stdout  # checked with the service's key

    _resign(dsn, keys / "audit-key.pem")  # with the service's own key: only the copy sees it
    resigned = coordinator("audit", "verify", "--config", service.config)
    assert resigned.returncode == 0, resigned.stdout
    caught = coordinator("audit", "verify", "--config", service.config, "--checkpoint", kept)
    assert caught.returncode == 1
    assert caught.stdout == (
        f"checkpoint {number}: the database's differs from the copy kept elsewhere\n"
    )


def test_an_exported_bundle_verifies_offline_and_not_after_one_byte_changes(
    dsn: str, services: Services
) -> None:
    keys = services.directory / "keys"
    service, _ = services.deploy(["notify"], NOTIFY, extra=signing(keys, every="PT1H"))
    [run] = _finished(dsn, service, 1)
    bundle = services.directory / "bundle.json"
    made = coordinator("audit", "export", "--config", service.config, "--run", run, "--out", bundle)
    assert made.returncode == 0, made.stderr  # no checkpoint yet within the hour: one is made
    public = keys / "audit-key.pub"
    printed = coordinator("audit", "public-key", "--config", service.config)
    assert printed.stdout == public.read_text()

    holds = coordinator("audit", "verify", "--bundle", bundle, "--public-key", public)
    assert holds.returncode == 0, holds.stdout + holds.stderr
    count = len(events(dsn, run))
    assert holds.stdout.startswith(
        f"bundle of run {run}: {count} events chained, the first {count} under checkpoint 1 "
    )
    assert "workflow notify " in holds.stdout and "last event: finished" in holds.stdout
    document = json.loads(bundle.read_bytes())
    assert [e["hash"] for e in document["events"]] == [e["hash"] for e in service.history(run)]
    assert canonical(parse(bundle.read_bytes())) + "\n" == bundle.read_text()

    data = bytearray(bundle.read_bytes())
    at = data.index(b'"actor":"') + len(b'"actor":"')
    data[at] ^= 0x01
    changed = services.directory / "changed.json"
    changed.write_bytes(bytes(data))
    refused = coordinator("audit", "verify", "--bundle", changed, "--public-key", public)
    assert refused.returncode == 1
    assert refused.stdout.startswith(f"bundle {changed}: run {run}: event 1: ")

    signing(services.directory / "other")
    foreign = coordinator(
        "audit", "verify", "--bundle", bundle, "--public-key",
        services.directory / "other" / "audit-key.pub",
    )  # fmt: skip
    assert foreign.returncode == 1
    assert "not the one given" in foreign.stdout
    usage = coordinator("audit", "verify", "--bundle", bundle)
    assert usage.returncode == 2
    assert "needs --public-key" in usage.stderr
    missing = coordinator(
        "audit", "export", "--config", service.config, "--run", str(uuid.uuid4()),
        "--out", bundle,
    )  # fmt: skip
    assert missing.returncode == 1
    assert "there is no run" in missing.stderr
