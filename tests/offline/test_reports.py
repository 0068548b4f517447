"""A subject report's extract, checked offline as an auditor or the subject would: what
was signed reads back whole, and any changed byte, another key or another spelling of
the same content is refused, never read as a report."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.semantics import reports
from registry_coordinator.semantics.bundles import Refused
from registry_coordinator.semantics.chain import parse

KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values)
def test_a_report_reads_back_as_it_was_signed(report: object) -> None:
    extract = reports.write({"runs": [report]}, KEY)
    assert reports.check(extract, KEY.public_key()) == parse(extract)["report"]


@given(json_values, st.data())
def test_any_changed_byte_is_refused(report: object, data: st.DataObject) -> None:
    extract = bytearray(reports.write({"runs": [report]}, KEY))
    at = data.draw(st.integers(0, len(extract) - 1))
    extract[at] = data.draw(st.integers(0, 255).filter(lambda b: b != extract[at]))
    with pytest.raises(Refused):
        reports.check(bytes(extract), KEY.public_key())


def test_another_key_and_another_spelling_are_refused() -> None:
    extract = reports.write({"subject": "a-1", "runs": []}, KEY)
    with pytest.raises(Refused, match="signed by another key"):
        reports.check(extract, OTHER.public_key())
    head, signature = extract.split(b'"signature":"')
    shouted = head + b'"signature":"' + signature.upper()  # the same bytes, spelt otherwise
    with pytest.raises(Refused, match="lower-case hex"):
        reports.check(shouted, KEY.public_key())
    spaced = extract.replace(b'"runs":[]', b'"runs": []')
    with pytest.raises(Refused, match="canonical form"):
        reports.check(spaced, KEY.public_key())
    forged = reports.write({"subject": "a-2", "runs": []}, OTHER)
    resigned = forged.replace(
        forged[forged.index(b'"key":') : forged.index(b',"report"')],
        extract[extract.index(b'"key":') : extract.index(b',"report"')],
    )
    with pytest.raises(Refused, match="signature does not hold"):
        reports.check(resigned, KEY.public_key())
