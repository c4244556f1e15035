#!/bin/sh
# Runs the example's tests against the sources of the pinned commit.
set -eu
. ./src/greet.sh
out=$(greet Kiln)
[ "$out" = "hello, Kiln" ] || { echo "FAIL: got '$out'" >&2; exit 1; }
echo "ok 1 - greet says hello"
out=$(greet)
[ "$out" = "hello, world" ] || { echo "FAIL: got '$out'" >&2; exit 1; }
echo "ok 2 - greet defaults to world"
echo "2 tests passed"
