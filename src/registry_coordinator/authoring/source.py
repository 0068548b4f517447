"""Reading YAML sources into plain JSON data plus a map of where each value stood.

Workflows and scenarios are authored in YAML but everything downstream works on
JSON-compatible data (the artifact is canonical JSON). This module is the one
place that turns untrusted YAML bytes into that data, and it is deliberately
strict so that what an author wrote and what runs cannot differ:

* the YAML 1.2 core schema for plain scalars (``no`` and ``12:30`` stay strings,
  no timestamps), because YAML 1.1's guesses silently change meaning;
* no anchors, aliases or merge keys (no expansion bombs, one spelling per value);
* no duplicate keys, only string keys, no tags, no NaN or infinity;
* a size and a nesting limit checked before and while parsing, never a traceback.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import yaml
from yaml.composer import ComposerError
from yaml.error import Mark
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.diagnostics import Diagnostic, Position, Refused

MAX_SOURCE_BYTES = 1024 * 1024
MAX_DEPTH = 32

#: A location inside a document: mapping keys and sequence indexes from the root.
DataPath = tuple[str | int, ...]

_KINDS = {int: "number", float: "number", bool: "boolean", type(None): "null"}
_PLAIN = "tag:registry-coordinator:plain"
#: Explicit YAML core tags are accepted where the value really is of that type.
_CORE: dict[str, type | tuple[type, ...]] = {
    "tag:yaml.org,2002:bool": bool,
    "tag:yaml.org,2002:int": int,
    "tag:yaml.org,2002:float": (float, int),
    "tag:yaml.org,2002:null": type(None),
}
_STR = "tag:yaml.org,2002:str"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT10 = re.compile(r"^[-+]?[0-9]+$")
_INT8 = re.compile(r"^0o[0-7]+$")
_INT16 = re.compile(r"^0x[0-9a-fA-F]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_NONFINITE = re.compile(r"^(?:[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


@dataclass(frozen=True)
class Located:
    """Where a value starts, whether it is a mapping or list, and whether its text is
    quoted (to place expression errors)."""

    position: Position
    quoted: bool = False
    collection: bool = False


@dataclass
class SourceMap:
    """Positions of values and keys by data path; empty for data that came from JSON."""

    file: str
    values: dict[DataPath, Located] = field(default_factory=dict)
    keys: dict[DataPath, Position] = field(default_factory=dict)

    def at(self, path: DataPath, *, key: bool = False) -> Position | None:
        """Where to point for ``path``: its key if asked, or if its value is a block
        mapping or list (which starts on the line after); else where the value
        starts. A path without a position falls back to its nearest ancestor."""
        for cut in range(len(path), -1, -1):
            prefix = path[:cut]
            found = self.values.get(prefix)
            if found is None:
                continue
            if (key or found.collection) and prefix in self.keys:
                return self.keys[prefix]
            return found.position
        return None

    def expression_origin(self, path: DataPath) -> tuple[Position, int] | None:
        """Where a string value's text begins: position and columns added by quoting."""
        found = self.values.get(path)
        if found is None:
            return None
        return found.position, 1 if found.quoted else 0


class _Loader(yaml.SafeLoader):
    """PyYAML's safe composer with a depth limit and with scalar resolution left to us."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.depth = 0

    def resolve(self, kind: type[Node], value: str | None, implicit: tuple[bool, bool]) -> str:
        if kind is ScalarNode:
            return _PLAIN if implicit[0] else _STR
        return _SEQ if kind is SequenceNode else _MAP

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise _SourceError(
                "yaml.alias",
                f"alias *{event.anchor} refers to another part of the file",
                "write the value out in full; anchors and aliases are not allowed in workflows",
                event.start_mark,
            )
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _SourceError(
                    "yaml.too-deep",
                    f"values are nested more than {MAX_DEPTH} levels deep",
                    "flatten the structure; no workflow needs this depth",
                    self.peek_event().start_mark,  # type: ignore[no-untyped-call]
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _SourceError(Exception):
    def __init__(self, code: str, message: str, repair: str, mark: Mark | None) -> None:
        super().__init__(message)
        self.code, self.message, self.repair = code, message, repair
        self.position = _position(mark)


def _position(mark: Mark | None) -> Position | None:
    if mark is None:
        return None
    return Position(mark.line + 1, mark.column + 1)


def read_source(path: Path, *, max_bytes: int = MAX_SOURCE_BYTES) -> bytes:
    """Read a source file's bytes, refusing what is missing or too large to be one."""
    file = str(path)
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise IsADirectoryError(file)
        if size > max_bytes:
            raise Refused(
                [
                    Diagnostic(
                        "yaml.too-large",
                        f"the file is {size} bytes; a source may be at most {max_bytes} bytes",
                        "check that this is the file you meant; split or trim it",
                        file,
                    )
                ]
            )
        return path.read_bytes()
    except OSError as exc:
        raise Refused(
            [
                Diagnostic(
                    "file.unreadable",
                    f"cannot read {file}: {exc.strerror or type(exc).__name__}",
                    "give the path of an existing, readable file",
                    file,
                )
            ]
        ) from None


def load_yaml(data: bytes, file: str) -> tuple[JSON, SourceMap]:
    """Parse one YAML document into JSON-compatible data and its source map."""

    def refuse(code: str, message: str, repair: str, pos: Position | None) -> Refused:
        return Refused([Diagnostic(code, message, repair, file, pos)])

    if len(data) > MAX_SOURCE_BYTES:
        raise refuse(
            "yaml.too-large",
            f"the document is {len(data)} bytes; at most {MAX_SOURCE_BYTES} are read",
            "check that this is the file you meant; split or trim it",
            None,
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise refuse(
            "yaml.encoding",
            f"byte {exc.start} is not valid UTF-8 ({exc.reason})",
            "save the file as UTF-8 text; binary files cannot be workflows",
            Position(line, column),
        ) from None

    try:
        root = _compose(text)
    except _SourceError as exc:
        raise refuse(exc.code, exc.message, exc.repair, exc.position) from None
    except ComposerError as exc:
        if "expected a single document" not in str(exc.context):
            raise _syntax(exc, file) from None
        raise refuse(
            "yaml.multiple-documents",
            "the file holds more than one YAML document",
            "keep one document per file; remove the extra '---' section",
            _position(exc.problem_mark),
        ) from None
    except yaml.MarkedYAMLError as exc:
        raise _syntax(exc, file) from None
    except yaml.YAMLError as exc:
        # ReaderError: control characters or other code points YAML does not allow.
        position = None
        index = getattr(exc, "position", None)
        if isinstance(index, int):
            before = text[:index]
            position = Position(before.count("\n") + 1, index - (before.rfind("\n") + 1) + 1)
        raise refuse(
            "yaml.syntax",
            f"not readable as YAML: {exc}".splitlines()[0],
            "save the file as plain UTF-8 text without control characters",
            position,
        ) from None

    if root is None:
        raise refuse(
            "yaml.empty",
            "the file holds no YAML document",
            "write the workflow document into the file",
            None,
        )
    source = SourceMap(file)
    return _convert(root, (), source), source


def _compose(text: str) -> Node | None:
    loader = _Loader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def _syntax(exc: yaml.MarkedYAMLError, file: str) -> Refused:
    problem = exc.problem or "malformed YAML"
    context = f" ({exc.context})" if exc.context else ""
    return Refused(
        [
            Diagnostic(
                "yaml.syntax",
                f"{problem}{context}",
                "fix the YAML here (indentation, quotes and brackets are the usual causes)",
                file,
                _position(exc.problem_mark),
            )
        ]
    )


def _convert(node: Node, path: DataPath, source: SourceMap) -> JSON:
    position = _position(node.start_mark) or Position(1, 1)
    quoted = isinstance(node, ScalarNode) and node.style in ("'", '"')
    source.values[path] = Located(position, quoted, not isinstance(node, ScalarNode))

    def refuse(code: str, message: str, repair: str, at: Position = position) -> Refused:
        return Refused([Diagnostic(code, message, repair, source.file, at)])

    if isinstance(node, ScalarNode):
        if "\x00" in node.value:
            raise refuse(
                "yaml.unsupported-value",
                "the text holds a NUL character, which cannot be stored or evaluated",
                "remove the \\0 escape",
            )
        if node.tag == _STR:
            return node.value
        if node.tag == _PLAIN:
            return _plain_scalar(node.value, refuse)
        if node.tag in _CORE:
            value = _plain_scalar(node.value, refuse)
            is_bool = isinstance(value, bool)
            if isinstance(value, _CORE[node.tag]) and is_bool == node.tag.endswith("bool"):
                return float(cast(float, value)) if node.tag.endswith("float") else value
        raise refuse(
            "yaml.unsupported-value",
            f"the tag {node.tag} is not allowed on {node.value!r}",
            "remove the tag; quote the value if it should be a string",
        )
    if isinstance(node, SequenceNode):
        if node.tag != _SEQ:
            raise refuse(
                "yaml.unsupported-value",
                f"the tag {node.tag} is not allowed",
                "remove the tag",
            )
        return [_convert(item, (*path, i), source) for i, item in enumerate(node.value)]
    assert isinstance(node, MappingNode)
    if node.tag != _MAP:
        raise refuse(
            "yaml.unsupported-value",
            f"the tag {node.tag} is not allowed",
            "remove the tag",
        )
    result: dict[str, JSON] = {}
    for key_node, value_node in node.value:
        key_at = _position(key_node.start_mark) or position
        if not isinstance(key_node, ScalarNode):
            raise refuse(
                "yaml.non-string-key",
                "a mapping key is itself a list or mapping",
                "use a plain string as the key",
                key_at,
            )
        if key_node.tag == _PLAIN and key_node.value == "<<":
            raise refuse(
                "yaml.alias",
                "merge keys (<<) are not allowed",
                "write the merged fields out in full",
                key_at,
            )
        key = key_node.value
        resolved = _plain_scalar(key, refuse) if key_node.tag == _PLAIN else key
        if not isinstance(resolved, str):
            raise refuse(
                "yaml.non-string-key",
                f"the key {key!r} reads as a {_KINDS[type(resolved)]}, not a string",
                f"quote the key: '{key}'",
                key_at,
            )
        if key in result:
            raise refuse(
                "yaml.duplicate-key",
                f"the key {key!r} appears twice in this mapping",
                "keep one of the two entries",
                key_at,
            )
        source.keys[(*path, key)] = key_at
        result[key] = _convert(value_node, (*path, key), source)
    return result


def _plain_scalar(text: str, refuse: Callable[[str, str, str], Refused]) -> JSON:
    """Resolve an unquoted scalar by the YAML 1.2 core schema."""
    if _NULL.match(text):
        return None
    if _BOOL.match(text):
        return text.lower() == "true"
    if _INT10.match(text):
        return int(text)
    if _INT8.match(text):
        return int(text[2:], 8)
    if _INT16.match(text):
        return int(text[2:], 16)
    if _NONFINITE.match(text):
        raise refuse(
            "yaml.unsupported-value",
            f"{text} is not a finite number and has no JSON form",
            "use a finite number, or quote the value to make it a string",
        )
    if _FLOAT.match(text):
        value = float(text)
        if not math.isfinite(value):
            raise refuse(
                "yaml.unsupported-value",
                f"{text} is too large to be a finite number",
                "use a smaller number, or quote the value to make it a string",
            )
        return value
    return text


def iter_paths(data: JSON, path: DataPath = ()) -> Iterator[tuple[DataPath, JSON]]:
    """Every (path, value) in a JSON value, parents before children."""
    yield path, data
    if isinstance(data, dict):
        for key, value in data.items():
            yield from iter_paths(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from iter_paths(value, (*path, index))
