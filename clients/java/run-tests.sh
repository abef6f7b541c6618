#!/usr/bin/env bash
# The Java client's tests (core, ShedLock, Spring Integration), as `make test` and
# `make test-java` run them: the servers come from the workspace's harness program, the module
# from REDIS_LOCK_MODULE (default <workspace>/target/debug/libredis_lock.so).
#
# Maven runs offline (-o) once ~/.m2 holds what these POMs need: a marker named after the POMs'
# hash, written after an online run succeeded. A fresh clone (or a changed POM) goes online once.
set -euo pipefail
cd "$(dirname "$0")"
repo=${MAVEN_REPO:-$HOME/.m2/repository}
marker="$repo/.redislock-java-$(cat pom.xml */pom.xml | sha256sum | cut -c1-16)"
if [ -f "$marker" ]; then
  mvn -q -B -o -Dstyle.color=never test
else
  mvn -q -B -Dstyle.color=never test
  mkdir -p "$repo" && touch "$marker"
fi
# -q prints nothing when all pass: the counts, from Surefire's reports
cat */target/surefire-reports/*.txt | grep -E '^Tests run' | awk -F'[:,]' '{r+=$2; f+=$4; e+=$6; s+=$8} END {printf "clients/java: %d tests, %d failures, %d errors, %d skipped\n", r, f, e, s}'
