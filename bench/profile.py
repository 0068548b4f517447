"""py-spy profiles of a benchmark's service process, and a summary that reads in a terminal.

`Profile(pid, path)` samples the process (without stopping it: `--nonblocking`) for as
long as the block lasts and writes py-spy's collapsed stacks ("frame;frame;frame count"
per line) to ``path``, which flamegraph tools and speedscope read. `summary(path)` says
where the samples fell: by the libraries a stack passes through (one sample counts for
every library on its stack, so the shares overlap), and the functions that were running
(self time).
"""

from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

#: The parts of the service a stack can pass through, by how its frames' files begin (py-spy
#: names a file from its package: ``(httpx/_models.py:996)``). One sample counts for every
#: part on its stack, so the shares overlap.
PARTS = {
    "the HTTP front (hypercorn, quart)": ("(hypercorn/", "(quart/"),
    "admission (http/admission.py)": ("(registry_coordinator/http/admission.py",),
    "JSON Schema": ("(jsonschema",),
    # psycopg's asyncio callbacks ran in trio-asyncio's own task, off database.py's stacks.
    "the database client (store/database.py, psycopg, trio-asyncio, asyncio)": (
        "(registry_coordinator/store/database.py",
        "(psycopg/",
        "(trio_asyncio/",
        "(asyncio/",
    ),
    "product calls (engine/calls.py)": ("(registry_coordinator/engine/calls.py",),
    "httpx and httpcore": ("(httpx/", "(httpcore/"),
    "the step semantics (semantics/)": ("(registry_coordinator/semantics/",),
    "expressions (authoring/expressions.py)": ("(registry_coordinator/authoring/expressions.py",),
    "tracing (observability/tracing.py)": ("(registry_coordinator/observability/tracing.py",),
    "metrics (prometheus_client)": ("(prometheus_client/",),
}


class Profile:
    """py-spy recording ``pid`` at ``rate`` samples a second while the block runs: the
    thread holding the GIL only, so that a database thread waiting on its socket (in C,
    which py-spy cannot tell from running) is not counted as work."""

    def __init__(self, pid: int, path: Path, rate: int = 200) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.path = path
        self.command = [
            spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--nonblocking",
            "--gil",  # only the thread holding the GIL: where the CPU goes, not who waits
            "--format",
            "raw",
            "--output",
            str(path),
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profile:
        with self.path.with_suffix(".log").open("wb") as log:  # the child's own from here
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        self.process.wait(60)


def summary(path: Path, top: int = 15) -> str:
    """The shares of samples by the part of the service on the stack, by the library of
    the function running, and the functions most often running."""
    stacks: list[tuple[list[str], int]] = []
    for line in path.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        if stack and samples.isdigit():  # py-spy sometimes writes a stray line: skipped
            stacks.append((stack.split(";"), int(samples)))
    total = sum(count for _, count in stacks) or 1
    parts: collections.Counter[str] = collections.Counter()
    libraries: collections.Counter[str] = collections.Counter()
    running: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        for part, markers in PARTS.items():
            if any(marker in frame for frame in frames for marker in markers):
                parts[part] += count
        running[_short(frames[-1])] += count
        libraries[_library(frames[-1])] += count
    lines = [f"  {total} samples in {path.name}; by the part of the service on the stack:"]
    lines += [f"    {100 * n / total:5.1f}%  {name}" for name, n in parts.most_common()]
    lines.append("  by the library of the function running (self):")
    lines += [f"    {100 * n / total:5.1f}%  {name}" for name, n in libraries.most_common(top)]
    lines.append("  the functions running (self):")
    lines += [f"    {100 * n / total:5.1f}%  {name}" for name, n in running.most_common(top)]
    return "\n".join(lines)


def _library(frame: str) -> str:
    """The package a frame's file is in (``trio``, ``psycopg``; ``registry_coordinator.http``),
    or the file for the standard library's top-level modules."""
    where = frame.partition(" (")[2].rsplit(":", 1)[0]
    parts = where.split("/")
    if parts[0] == "registry_coordinator" and len(parts) > 2:
        return ".".join(parts[:2])
    return parts[0] if len(parts) > 1 else where


def _short(frame: str) -> str:
    """``function (lib/file.py:12)`` as ``function (lib/file.py)``: a function, not a line."""
    return frame.rsplit(":", 1)[0] + ")"


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(summary(Path(name)))
