# Recipes for working on Registry Coordinator. `./run <recipe>` bootstraps .venv first.

set shell := ["bash", "-eu", "-o", "pipefail", "-c"]

bin := ".venv/bin"

# List the recipes
default:
    @{{just_executable()}} --list

# The tutorial end to end: a real run, reviewed, approved and notified
demo *args:
    {{bin}}/coordinator demo {{args}}

# Lint, format check, type check, then the whole test suite
test *args: lint packages
    {{bin}}/pytest -n 3 --dist worksteal {{args}}

# Debian packages the tests use, apt-get installed when missing (if run as root): Chromium
# for tests/browser, systemd's systemd-analyze for the unit's verification, PgBouncer for
# the service behind a transaction-mode pool, Prometheus's promtool for the alert rules' tests
packages:
    #!/usr/bin/env bash
    set -euo pipefail
    missing=()
    [ -x "${CHROMIUM:-/usr/bin/chromium}" ] || missing+=(chromium fonts-liberation)
    command -v systemd-analyze >/dev/null || missing+=(systemd)
    [ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null || missing+=(pgbouncer)
    command -v promtool >/dev/null || missing+=(prometheus)
    [ ${#missing[@]} -eq 0 ] && exit 0
    if [ "$(id -u)" != 0 ]; then
        echo "missing ${missing[*]}, so some tests will fail: sudo apt-get install ${missing[*]}"
        exit 0
    fi
    echo "installing ${missing[*]} for the tests (apt-get)..."
    log=.venv/apt-packages.log
    if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
        tail -n 20 "$log"
        echo "installing ${missing[*]} failed (whole log: $log)" >&2
        exit 1
    fi

# ruff (lint and format) and mypy
lint:
    {{bin}}/ruff check src tests bench mutation
    {{bin}}/ruff format --check src tests bench mutation
    {{bin}}/mypy

# Rewrite the code in the project's format
fmt:
    {{bin}}/ruff format src tests bench mutation
    {{bin}}/ruff check --fix src tests bench mutation

# Check and test every workflow under workflows/
workflows:
    for w in workflows/*/; do {{bin}}/coordinator check "$w" && {{bin}}/coordinator test "$w"; done

# Mutation testing (not part of `test`): both parts below, each reported; docs/mutation-testing.md
mutants:
    status=0; {{just_executable()}} mutants-pure || status=1; {{just_executable()}} mutants-durability || status=1; exit $status

# mutmut over steps, expressions, checker and canonical with their fast tests; kill rate per module
mutants-pure:
    [ -x {{bin}}/mutmut ] || {{bin}}/python -m pip install --quiet -e '.[mutants]'
    rm -rf mutants
    PYTHONPATH="{{justfile_directory()}}/mutation" {{bin}}/mutmut run --max-children 2
    {{bin}}/python mutation/scores.py

# The curated durability mutations (mutation/durability.yaml): each must fail its named tests
mutants-durability *ids:
    {{bin}}/python mutation/durability.py {{ids}}

# Benchmarks (not part of the tests): just bench [throughput wake timers idle recovery peer ...]
bench *args:
    {{bin}}/python -c 'import dbos' 2>/dev/null || {{bin}}/python -m pip install --quiet -e '.[bench]'
    {{bin}}/python bench/run.py {{args}}
