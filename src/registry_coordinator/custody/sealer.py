"""The sealer a store uses: the installation it is in, the data key it seals new values
under, and every key it can open with. JSON values go in and out; what is stored is
the sealed value in base64, a JSON string, so a jsonb column and its SQL stay as they
are (``outputs || %(outputs)s`` merges sealed outputs as it merged plain ones).

The run's row says whether its values are sealed (``runs.data_key``), never the value's
shape: a run's input may itself be any string.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass, field

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.custody.sealing import (
    CustodyCode,
    DataKey,
    Place,
    Purpose,
    Unopenable,
    open_sealed,
    seal,
)


@dataclass(frozen=True)
class Sealer:
    """Seals under ``key``; opens with any of ``keys`` (None for an erased key)."""

    installation: uuid.UUID
    key: DataKey = field(repr=False)
    keys: dict[int, DataKey | None] = field(repr=False)

    def seal(self, run: uuid.UUID | str, purpose: Purpose, step: str, value: JSON) -> str:
        """``value`` sealed for its place, as the JSON string a jsonb column holds."""
        place = Place(self.installation, _id(run), purpose, step)
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return base64.b64encode(seal(self.key, place, text.encode())).decode()

    def open(self, run: uuid.UUID | str, purpose: Purpose, step: str, stored: JSON) -> JSON:
        """The value ``stored`` holds, read at its place; :class:`Unopenable` otherwise."""
        place = Place(self.installation, _id(run), purpose, step)
        try:
            sealed = base64.b64decode(stored, validate=True) if isinstance(stored, str) else b""
        except binascii.Error:
            sealed = b""
        if not sealed:
            raise Unopenable(CustodyCode.MALFORMED, f"{place} is not a sealed value")
        value: JSON = json.loads(open_sealed(self.keys, place, sealed))
        return value


def sealer_for(sealer: Sealer | None, run: object) -> Sealer:
    """``sealer``, for ``run`` whose data is sealed; refused where there is none (a start
    refuses such a database first: this holds a store used without its custody)."""
    if sealer is None:
        raise Unopenable(
            CustodyCode.KEK_MISSING,
            f"run {run}'s data is sealed, and the configuration has no custody keys: "
            "give custody: {keys: ..., active: N} as it was",
        )
    return sealer


def _id(run: uuid.UUID | str) -> uuid.UUID:
    return run if isinstance(run, uuid.UUID) else uuid.UUID(run)
