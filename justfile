# Recipes for working on Registry Coordinator. `./run <recipe>` bootstraps .venv first.

set shell := ["bash", "-eu", "-o", "pipefail", "-c"]

bin := ".venv/bin"

# List the recipes
default:
    @just --list

# The tutorial end to end: a real run, reviewed, approved and notified
demo *args:
    {{bin}}/coordinator demo {{args}}

# Lint, format check, type check, then the whole test suite
test *args: lint
    {{bin}}/pytest -n 2 {{args}}

# ruff (lint and format) and mypy
lint:
    {{bin}}/ruff check src tests bench
    {{bin}}/ruff format --check src tests bench
    {{bin}}/mypy

# Rewrite the code in the project's format
fmt:
    {{bin}}/ruff format src tests bench
    {{bin}}/ruff check --fix src tests bench

# Check and test every workflow under workflows/
workflows:
    for w in workflows/*/; do {{bin}}/coordinator check "$w" && {{bin}}/coordinator test "$w"; done

# Benchmarks (not part of the tests): just bench [throughput wake timers idle recovery]
bench *args:
    {{bin}}/python bench/run.py {{args}}
