"""strict_json's refusals, each with its reason and a detail that says what broke.

The property tests check which inputs are refused; these check the boundary of the
nesting limit, NUL in an object's key, and what a refusal tells the caller (its
``reason``, and the detail that reaches an operator); and the canonical bytes
themselves — where mutation testing (``just mutants-pure``) found no test.
"""

from __future__ import annotations

import pytest

from registry_coordinator.authoring.canonical import (
    CanonicalError,
    UnusableJson,
    canonical_bytes,
    digest_of,
    strict_json,
)

NUL_OR_SURROGATE = (
    "it holds a NUL character (\\u0000) or an unpaired surrogate, which cannot be stored"
)


@pytest.mark.parametrize(
    ("data", "reason", "why"),
    [
        (b"{not json", "not-json", "not JSON: Expecting property name enclosed in double quotes"),
        (b"[NaN]", "not-json", "not JSON: NaN is not a JSON number"),
        (b"[1e999]", "not-json", "not JSON: 1e999 is too large for a JSON number"),
        (b"[[[1]]]", "too-deep", "arrays and objects nest over 2 deep"),
        (b'{"a\\u0000": 1}', "unstorable", NUL_OR_SURROGATE),
        (b'["\\ud800"]', "unstorable", NUL_OR_SURROGATE),
    ],
)
def test_each_refusal_has_its_reason_and_says_why(data: bytes, reason: str, why: str) -> None:
    with pytest.raises(UnusableJson) as refused:
        strict_json(data, max_nesting=2)
    assert refused.value.reason == reason
    assert str(refused.value).startswith(why)
    if reason != "not-json":  # the parser's own message ends with where it stopped
        assert str(refused.value) == why


def test_nesting_up_to_the_limit_is_taken() -> None:
    assert strict_json(b'[{"a": 1}]', max_nesting=2) == [{"a": 1}]
    assert strict_json(b'{"k\\u00e9": "\\u00e9"}') == {"ké": "é"}


def test_canonical_bytes_are_sorted_compact_utf_8() -> None:
    assert canonical_bytes({"é": 1.5, "b": [1, None]}) == '{"b":[1,null],"é":1.5}'.encode()
    with pytest.raises(CanonicalError, match=r"^Out of range float values are not JSON compliant"):
        canonical_bytes({"n": float("nan")})


def test_a_digest_is_sha256_in_the_form_operators_pin() -> None:
    assert digest_of(b"") == (
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
