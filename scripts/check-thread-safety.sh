#!/usr/bin/env bash
# Compiles every library and app translation unit of a configured build with clang's
# thread-safety analysis (-Wthread-safety, warnings as errors), syntax only: the annotations of
# src/common/mutex.h and src/common/thread_annotations.h are checked without a second full build.
# First it makes sure clang rejects scripts/thread_safety_canary.cc (an unguarded access), so the
# check cannot pass because the annotations expand to nothing.
# Usage: scripts/check-thread-safety.sh [BUILD_DIR] [JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
JOBS=${2:-$(nproc)}
CLANGXX=${CLANGXX:-clang++}
DB="$BUILD_DIR/compile_commands.json"
[[ -f "$DB" ]] || { echo "check-thread-safety: $DB not found (configure first)" >&2; exit 2; }
command -v "$CLANGXX" >/dev/null || { echo "check-thread-safety: $CLANGXX not found" >&2; exit 2; }

if "$CLANGXX" -fsyntax-only -Wthread-safety -Werror -Isrc -std=c++20 \
    scripts/thread_safety_canary.cc 2>/dev/null; then
  echo "check-thread-safety: clang accepted an unguarded access (annotations are not active)" >&2
  exit 1
fi

/usr/bin/python3 - "$DB" "$CLANGXX" <<'PY' | xargs -0 -P "$JOBS" -n 1 bash -c
import json, shlex, sys
db, clangxx = sys.argv[1], sys.argv[2]
for entry in json.load(open(db)):
    f = entry["file"]
    if not f.endswith(".cc") or f.endswith("_test.cc") or f.endswith("_itest.cc"):
        continue
    args = shlex.split(entry["command"])[1:]
    out, skip = [], False
    for a in args:  # the real build's flags (-Wall -Wextra -Werror too), less output and codegen
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a not in ("-c", "-g") and not a.startswith("-O"):
            out.append(a)
    cmd = [clangxx, "-fsyntax-only", "-Wthread-safety", "-Werror"] + out
    sys.stdout.write("cd " + shlex.quote(entry["directory"]) + " && " + shlex.join(cmd) + "\0")
PY
echo "check-thread-safety: clean"
