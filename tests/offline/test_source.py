"""Hostile and malformed sources: a clear diagnostic and exit 1, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.authoring.source import MAX_DEPTH, load_yaml
from tests.support import WORKFLOWS, coordinator


def refused_code(path: Path) -> tuple[str, str]:
    result = coordinator("check", path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    return first.split("[", 1)[1].split("]", 1)[0], first


def test_binary_junk(tmp_path: Path) -> None:
    path = tmp_path / "workflow.yaml"
    path.write_bytes(os.urandom(4096) + b"\xff\xfe\x00")
    code, line = refused_code(path)
    assert code == "yaml.encoding", line


def test_nul_bytes_in_utf8(tmp_path: Path) -> None:
    path = tmp_path / "workflow.yaml"
    path.write_bytes(b"id: corpus\nkind: \x00Workflow\n")
    code, line = refused_code(path)
    assert code == "yaml.syntax"
    assert ":2:" in line


def test_ten_megabyte_file(tmp_path: Path) -> None:
    path = tmp_path / "workflow.yaml"
    path.write_bytes(b"# padding\n" * 1_000_000)
    code, line = refused_code(path)
    assert code == "yaml.too-large"
    assert "10000000 bytes" in line


@pytest.mark.parametrize("opener", ["[", "{a: "])
def test_deeply_nested(tmp_path: Path, opener: str) -> None:
    path = tmp_path / "workflow.yaml"
    path.write_text("steps: " + opener * 100_000)
    code, _ = refused_code(path)
    assert code == "yaml.too-deep"


def test_nesting_at_the_limit_is_read() -> None:
    text = "a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    data, _ = load_yaml(text.encode(), "x.yaml")
    assert isinstance(data["a"], list)
    with pytest.raises(Refused) as refused:
        load_yaml(("a: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH).encode(), "x.yaml")
    assert refused.value.diagnostics[0].code == "yaml.too-deep"


def test_billion_laughs_is_refused_before_expansion(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    path = tmp_path / "workflow.yaml"
    path.write_text("\n".join(lines))
    code, line = refused_code(path)
    assert code == "yaml.alias"
    assert ":2:" in line


def test_missing_file_and_directory(tmp_path: Path) -> None:
    code, _ = refused_code(tmp_path / "nope.yaml")
    assert code == "file.unreadable"
    code, _ = refused_code(tmp_path)  # a directory without workflow.yaml
    assert code == "file.unreadable"


def test_yaml_1_2_core_scalars() -> None:
    data, _ = load_yaml(
        b"a: no\nb: 12:30\nc: 2026-01-05\nd: 0o17\ne: 0x1f\nf: 1e3\ng: ~\nh: True\ni: 010\n",
        "x.yaml",
    )
    assert data == {
        "a": "no",
        "b": "12:30",
        "c": "2026-01-05",
        "d": 15,
        "e": 31,
        "f": 1000.0,
        "g": None,
        "h": True,
        "i": 10,
    }


def test_artifact_size_limit(tmp_path: Path) -> None:
    source = (WORKFLOWS / "review-application" / "workflow.yaml").read_text()
    padding = "x" * 400_000
    source = source.replace("title: Review", f"description: {padding}\ntitle: Review", 1)
    path = tmp_path / "workflow.yaml"
    path.write_text(source)
    code, _ = refused_code(path)
    assert code == "limit.artifact-size"
