#!/usr/bin/env bash
# Installs everything the project needs into ./.venv (idempotent; fast when nothing changed).
# Java 17 + Maven are needed for the test broker; installed from Debian when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing Java 17 and Maven from Debian" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
    else
        echo "bootstrap: Java 17 and Maven are required (for the test broker); please install them" >&2
        exit 1
    fi
fi

# The browser tests drive Debian's chromium (Playwright's own browser download is not used).
if ! command -v "${PULSARSTATE_CHROMIUM:-chromium}" >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing chromium from Debian (for the browser tests)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "bootstrap: chromium is required (for the browser tests); please install it" >&2
        exit 1
    fi
fi

PY=${PYTHON:-python3}
if ! "$PY" -m uv --version >/dev/null 2>&1 && ! command -v uv >/dev/null 2>&1; then
    "$PY" -m pip install -q --disable-pip-version-check uv
fi
UV="uv"; command -v uv >/dev/null 2>&1 || UV="$PY -m uv"

# Exact versions from the lock (refreshed on purpose by dev/lock), then the project itself without resolving.
# Bytecode is compiled at install: with PYTHONDONTWRITEBYTECODE set (as on CI machines) Python would
# otherwise compile Airflow from source in every process, about half the CPU of each `airflow` command.
lock=requirements/test.lock
stamp=.venv/.installed-$(cat pyproject.toml "$lock" dev/bootstrap.sh | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
    [ -x .venv/bin/python ] || $UV venv -q --python "$PY" .venv
    echo "bootstrap: installing the locked dependencies ($lock) and the project into .venv" >&2
    $UV pip sync -q --compile-bytecode --python .venv/bin/python "$lock"
    $UV pip install -q --compile-bytecode --python .venv/bin/python --no-deps -e .
    rm -f .venv/.installed-*
    touch "$stamp"
fi
