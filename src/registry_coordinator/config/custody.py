"""The ``custody`` section, read by the store: the key-encryption keys (KEKs) that wrap
the data keys personal data is sealed under, each by reference and with its version, and
which version wraps new keys (docs/custody.md).

A KEK is 32 random bytes written as 64 hexadecimal digits (``coordinator keys generate``
makes one). Versions stay listed after a rotation until no data key is wrapped under
them: a version left out makes the keys wrapped under it unreadable, which the store
refuses at startup rather than at the first run that needs one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.fields import Reader
from registry_coordinator.authoring.source import DataPath
from registry_coordinator.config.values import read_integer, read_secret
from registry_coordinator.custody import Kek

_HEX = re.compile(r"[0-9a-fA-F]{64}")
#: Versions are small positive whole numbers, as the file's keys spell them.
_VERSION = re.compile(r"[1-9][0-9]{0,8}")


@dataclass(frozen=True)
class CustodyConfig:
    """The KEKs by version, and the active one (None: nothing is sealed)."""

    keks: dict[int, Kek] = field(default_factory=dict, repr=False)
    active: int | None = None


def read_custody(reader: Reader, value: JSON) -> CustodyConfig:
    """The KEKs of ``custody.keys`` (version: reference) and ``custody.active``."""
    path: DataPath = ("custody",)
    data = reader.mapping(value, path, "custody") or {}
    if not data or not reader.fields(data, path, "custody", ["keys", "active"], []):
        return CustodyConfig()
    keys_path: DataPath = (*path, "keys")
    listed = reader.mapping(data["keys"], keys_path, "custody.keys") or {}
    keks: dict[int, Kek] = {}
    for name in listed:
        if not _VERSION.fullmatch(name):
            reader.report(
                "config.invalid-value",
                f"custody.keys has {name!r}, which is not a version (1, 2, ...)",
                'name each key-encryption key by its version: keys: {"1": file:/path}',
                (*keys_path, name),
            )
            continue
        text = read_secret(reader, listed, name, keys_path, "custody.keys")
        if text is None:
            continue
        if not _HEX.fullmatch(text.strip()):
            reader.report(
                "config.invalid-value",
                f"custody.keys {name} is not a key-encryption key: 64 hexadecimal digits",
                "make one with: coordinator keys generate --out FILE",
                (*keys_path, name),
            )
            continue
        keks[int(name)] = Kek(int(name), bytes.fromhex(text.strip()))
    active = read_integer(reader, data, "active", path, 1, 1, 999_999_999)
    if listed and active not in keks and str(active) not in listed:
        reader.report(
            "config.invalid-value",
            f"custody.active is {active}, and custody.keys has no key {active}",
            "list the active key-encryption key under custody.keys, or name a listed one",
            (*path, "active"),
        )
    return CustodyConfig(keks, active)
