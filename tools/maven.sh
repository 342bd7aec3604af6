#!/usr/bin/env bash
# maven.sh ARGS...: Maven in batch mode with ARGS, silent unless it fails; then its output, without
# terminal escapes, on stderr, and its exit status. tools/setup.sh fetches jars with it: a first
# `make demo` shows pgcdc's words only. Debian's Maven 3.8.7 writes ESC[0m resets through jansi
# even with -q -B -Dstyle.color=never; -Djansi.noreset=true stops them.
set -uo pipefail
output=$(MAVEN_OPTS="${MAVEN_OPTS:-} -Djansi.noreset=true" mvn -q -B -Dstyle.color=never "$@" 2>&1)
status=$?
if [ "$status" -ne 0 ]; then
    printf '%s\n' "$output" | sed 's/\x1b\[[0-9;]*[A-Za-z]//g' >&2
fi
exit "$status"
