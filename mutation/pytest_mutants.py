"""A pytest plugin for mutmut's runs only: ``just mutants-pure`` loads it with ``-p``.

Every surviving mutant runs every fast test that reaches its function, and the
property tests (hundreds of examples each) were nine tenths of that time. So, in
these runs only:

- each property test takes at most 25 examples, derandomized, with no example
  database and no deadline: a mutant's verdict must depend neither on earlier runs
  nor on the machine being slow under mutmut's trampolines (a missed deadline is no
  kill). The tests' own ``@settings`` would override a profile, so the cap is set on
  each collected test, as Hypothesis's own ``@seed`` sets its settings;
- the example tests run first, so that a mutant one of them kills stops there (mutmut
  runs pytest with ``-x``) before any property test has started.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

EXAMPLES = 25


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        test = getattr(item, "obj", None)
        chosen = getattr(test, "_hypothesis_internal_use_settings", None)
        if isinstance(chosen, settings):
            test._hypothesis_internal_use_settings = settings(  # type: ignore[union-attr]
                chosen,
                max_examples=min(chosen.max_examples, EXAMPLES),
                derandomize=True,
                database=None,
                deadline=None,
            )
    items.sort(key=lambda item: getattr(getattr(item, "obj", None), "is_hypothesis_test", False))
