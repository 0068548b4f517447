"""Personal data in custody: values sealed where they belong, under data keys that a
key-encryption key wraps (docs/custody.md). Pure: no database, no event loop; the store
keeps the wrapped keys, and the layers above seal and open through this package."""

from registry_coordinator.custody.sealer import (
    EVENT_FIELDS,
    SENDING,
    Sealer,
    sealer_for,
)
from registry_coordinator.custody.sealing import (
    NO_RUN,
    CustodyCode,
    DataKey,
    Kek,
    Place,
    Purpose,
    Unopenable,
    key_of,
    new_kek,
    open_sealed,
    seal,
    unwrap,
    wrap,
)

__all__ = [
    "EVENT_FIELDS",
    "NO_RUN",
    "SENDING",
    "CustodyCode",
    "DataKey",
    "Kek",
    "Place",
    "Purpose",
    "Sealer",
    "Unopenable",
    "key_of",
    "new_kek",
    "open_sealed",
    "seal",
    "sealer_for",
    "unwrap",
    "wrap",
]
