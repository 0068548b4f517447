"""The command line as a public surface, pinned: every command and subcommand, each with
its arguments and whether it is required, and the exit codes a command ends with.

Scripts, systemd units, the documentation and operators' habits call these commands, so
a change to them is a change to the product, made on purpose: the tree below is written
out by hand, never read from the code at test time, so an option added, removed, renamed
or made required fails here until the tree below says so too (as httpx pins its
``__all__``). The walk reads the real parser that ``coordinator`` runs, the options kept
from ``--help`` (a supervisor's ``--child`` and its descriptors) included.
"""

from __future__ import annotations

import argparse

from registry_coordinator import cli
from registry_coordinator.cli.tree import handler
from registry_coordinator.errors import ExitCode

REQUIRED = "required"
OPTIONAL = "optional"
#: The options every remote command takes (``runs ...``, ``admission ...``).
REMOTE = {"--url": OPTIONAL, "--token-file": OPTIONAL, "--format": OPTIONAL}

#: Each command by its words, with its arguments: an option by its flags, a positional
#: argument as <its name>, and the choice of subcommand as <its name> too.
TREE = {
    "coordinator": {"--version": OPTIONAL, "<command>": REQUIRED},
    "coordinator check": {"<paths>": REQUIRED, "--format": OPTIONAL, "--explain": OPTIONAL},
    "coordinator test": {"<path>": REQUIRED, "--scenarios": OPTIONAL, "--format": OPTIONAL},
    "coordinator package": {"<path>": REQUIRED, "--output": REQUIRED},
    "coordinator digest": {"<artifact>": REQUIRED},
    "coordinator graph": {"<path>": REQUIRED, "--format": OPTIONAL},
    "coordinator catalog": {"<product>": OPTIONAL, "<operation>": OPTIONAL},
    "coordinator serve": {
        "--config": REQUIRED,
        "--processes": OPTIONAL,
        "--process-ports": OPTIONAL,
        "--child": OPTIONAL,
        "--listen-fd": OPTIONAL,
        "--process-fd": OPTIONAL,
        "--supervisor-fd": OPTIONAL,
        "--recovery-only": OPTIONAL,
    },
    "coordinator migrate": {"--config": REQUIRED},
    "coordinator doctor": {"--config": REQUIRED},
    "coordinator recovery": {"<action>": REQUIRED},
    "coordinator recovery status": {"--config": REQUIRED},
    "coordinator recovery end": {"--config": REQUIRED, "--reason": REQUIRED},
    "coordinator stand-ins": {
        "--product": OPTIONAL,
        "--webhook": OPTIONAL,
        "--delivery-delay": OPTIONAL,
        "--issuer": OPTIONAL,
        "--issuer-key": OPTIONAL,
        "--audience": OPTIONAL,
        "--token-lifetime": OPTIONAL,
    },
    "coordinator token": {
        "--key": REQUIRED,
        "--client": REQUIRED,
        "--scope": OPTIONAL,
        "--config": OPTIONAL,
        "--lifetime": OPTIONAL,
        "--issuer": OPTIONAL,
        "--audience": OPTIONAL,
    },
    "coordinator audit": {"<audit>": REQUIRED},
    "coordinator audit verify": {
        "--config": OPTIONAL,
        "--run": OPTIONAL,
        "--since": OPTIONAL,
        "--bundle": OPTIONAL,
        "--report": OPTIONAL,
        "--public-key": OPTIONAL,
        "--checkpoint": OPTIONAL,
    },
    "coordinator audit export": {
        "--config": REQUIRED,
        "--run": REQUIRED,
        "--out": REQUIRED,
        "--record": OPTIONAL,
    },
    "coordinator audit replay": {"--bundle": REQUIRED, "--public-key": OPTIONAL},
    "coordinator audit checkpoint": {"--config": REQUIRED, "--out": OPTIONAL},
    "coordinator audit public-key": {"--config": REQUIRED},
    "coordinator audit keygen": {"--out": REQUIRED},
    "coordinator subject": {"<subject>": REQUIRED},
    "coordinator subject report": {"--config": REQUIRED, "--subject": REQUIRED, "--out": REQUIRED},
    "coordinator keys": {"<keys>": REQUIRED},
    "coordinator keys seal": {"--config": REQUIRED},
    "coordinator keys generate": {"--out": REQUIRED},
    "coordinator keys rotate": {"--config": REQUIRED},
    "coordinator runs": {"<action>": REQUIRED},
    "coordinator runs start": {
        **REMOTE,
        "<workflow>": REQUIRED,
        "--input": REQUIRED,
        "--version": OPTIONAL,
        "--key": OPTIONAL,
    },
    "coordinator runs list": {
        **REMOTE,
        "--state": OPTIONAL,
        "--workflow": OPTIONAL,
        "--field": OPTIONAL,
        "--limit": OPTIONAL,
        "--cursor": OPTIONAL,
        "--archived": OPTIONAL,
    },
    "coordinator runs status": {**REMOTE, "<run>": REQUIRED},
    "coordinator runs history": {**REMOTE, "<run>": REQUIRED},
    "coordinator runs cancel": {**REMOTE, "<run>": REQUIRED, "--reason": REQUIRED},
    "coordinator runs retry-same": {
        **REMOTE,
        "<run>": REQUIRED,
        "--reason": REQUIRED,
        "--attestation": OPTIONAL,
        "--binding": OPTIONAL,
    },
    "coordinator runs reconcile": {**REMOTE, "<run>": REQUIRED, "--reason": REQUIRED},
    "coordinator admission": {"<action>": REQUIRED},
    "coordinator admission hold": {**REMOTE, "--reason": REQUIRED, "--workflow": OPTIONAL},
    "coordinator admission release": {**REMOTE, "--reason": REQUIRED, "--workflow": OPTIONAL},
    "coordinator connections": {"<action>": REQUIRED},
    "coordinator bulk": {"<action>": REQUIRED},
    "coordinator approvals": {"<action>": REQUIRED},
    "coordinator approvals list": REMOTE,
    **{
        f"coordinator approvals {decision}": {
            **REMOTE,
            "<approval>": REQUIRED,
            "--reason": REQUIRED,
        }
        for decision in ("approve", "reject")
    },
    "coordinator connections list": REMOTE,
    "coordinator connections pause": {**REMOTE, "<connection>": REQUIRED, "--reason": REQUIRED},
    "coordinator connections resume": {**REMOTE, "<connection>": REQUIRED, "--reason": REQUIRED},
    "coordinator bulk preview": {
        **REMOTE,
        "--action": REQUIRED,
        "--workflow": OPTIONAL,
        "--version": OPTIONAL,
        "--state": OPTIONAL,
        "--hold-code": OPTIONAL,
        "--connection": OPTIONAL,
        "--admitted-after": OPTIONAL,
        "--admitted-before": OPTIONAL,
        "--field": OPTIONAL,
        "--per-second": OPTIONAL,
    },
    "coordinator bulk list": REMOTE,
    "coordinator bulk show": {**REMOTE, "<job>": REQUIRED},
    **{
        f"coordinator bulk {change}": {**REMOTE, "<job>": REQUIRED, "--reason": REQUIRED}
        for change in ("start", "pause", "resume", "cancel")
    },
    "coordinator erase": {**REMOTE, "--subject": REQUIRED, "--reason": REQUIRED},
    "coordinator demo": {
        "--workflows": OPTIONAL,
        "--data": OPTIONAL,
        "--interactive": OPTIONAL,
        "--keep-running": OPTIONAL,
    },
    "coordinator review": {
        "<request>": REQUIRED,
        "<decision>": REQUIRED,
        "--casework": REQUIRED,
        "--outcome": OPTIONAL,
    },
}

#: How a command ends (the package docstring of ``registry_coordinator.cli`` says when).
EXIT_CODES = {"OK": 0, "INVALID": 1, "USAGE": 2, "UNAVAILABLE": 3, "INTERRUPTED": 130}


def walk(parser: argparse.ArgumentParser, words: str = "coordinator") -> dict[str, dict[str, str]]:
    """The tree under ``parser``, in :data:`TREE`'s terms (``--help`` left out: every
    parser has it)."""
    arguments: dict[str, str] = {}
    found = {words: arguments}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or f"<{action.dest}>"
        arguments[name] = REQUIRED if action.required else OPTIONAL
        if isinstance(action, argparse._SubParsersAction):
            for word, subparser in action.choices.items():
                found |= walk(subparser, f"{words} {word}")
    return found


def test_the_command_tree_is_the_one_written_here() -> None:
    found = walk(cli.parser())
    assert sorted(found) == sorted(TREE), "commands added or removed"
    changed = {words: found[words] for words in TREE if found[words] != TREE[words]}
    assert not changed, f"arguments changed (what the parser has): {changed}"


def test_every_command_has_its_handler() -> None:
    for words in TREE:
        command = words.split()[1:2]
        if command:
            assert callable(handler(command[0])), words


def test_the_exit_codes_are_a_closed_list() -> None:
    assert {code.name: code.value for code in ExitCode} == EXIT_CODES


def test_the_walk_sees_an_option_added_and_one_made_required() -> None:
    """The test above can fail: a parser with one option more, or one made required,
    walks to a tree that is not the one written."""
    parser = cli.parser()
    assert walk(parser) == TREE
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands.choices["doctor"].add_argument("--verbose", action="store_true")
    [catalog] = [a for a in commands.choices["catalog"]._actions if a.dest == "product"]
    catalog.required = True
    changed = walk(parser)
    assert changed["coordinator doctor"] == {"--config": REQUIRED, "--verbose": OPTIONAL}
    assert changed["coordinator catalog"]["<product>"] == REQUIRED
