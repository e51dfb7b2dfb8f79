#!/usr/bin/env bash
# The whole test suite on a fresh machine: makes .venv, installs modalscope with its test
# extra (with uv, else pip), and runs pytest on both cores. Storage tests run on SQLite and
# on PostgreSQL (MODALSCOPE_TEST_POSTGRES, default the local server); without a reachable
# PostgreSQL the PostgreSQL half is reported as skipped, with the reason — unless
# MODALSCOPE_REQUIRE_POSTGRES=1 (CI), which makes it fail instead.
# `scripts/test.sh -m quick` runs the inner-loop subset: SQLite only, no browser, no child
# processes (marked at collection in tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# uv installs the same releases pip would, several times faster; pip is the fallback where
# uv cannot be had. Bytecode is compiled at install, as pip does, so that no test process
# compiles the dependencies again (the machine may set PYTHONDONTWRITEBYTECODE).
if ! { .venv/bin/python -m pip install --quiet --disable-pip-version-check uv >/dev/null 2>&1 &&
        .venv/bin/python -m uv pip install --quiet --compile-bytecode --python .venv/bin/python -e '.[test]'; }; then
    echo "uv could not install the test extra; installing with pip ..." >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
fi

# Browser tests need Debian's chromium + chromium-driver; install them when we can.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing chromium and chromium-driver for the browser tests ..." >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
            || echo "warning: could not install chromium; browser tests will fail" >&2
    fi
fi

exec .venv/bin/python -m pytest -n 2 --durations=15 "$@"
