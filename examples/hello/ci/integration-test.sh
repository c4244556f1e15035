#!/bin/sh
# Runs the artifact that compile published (restored by Kiln, verified by sha256).
set -eu
jar=${1:?usage: integration-test.sh path/to/app.jar}
echo "testing $(sha256sum "$jar")"
out=$(sh "$jar" integration)
[ "$out" = "hello, integration" ] || { echo "FAIL: got '$out'" >&2; exit 1; }
echo "ok - the published app greets"
