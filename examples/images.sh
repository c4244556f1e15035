#!/usr/bin/env bash
# Runs examples/images (two registry images and a Dockerfile image) on a
# server plus one container agent: sets up Podman's API, a loopback
# registry and the test images (scripts/container-env, needs root), builds
# Kiln, and follows the run. Kiln keeps running afterwards.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/kiln-target}
. "$here/scripts/container-env"
listen=${KILN_DEMO_LISTEN:-127.0.0.1:7071}
work=${KILN_DEMO_DIR:-$(mktemp -d /tmp/kiln-images.XXXXXX)}

if [ -n "${KILN_BIN:-}" ]; then
    kiln=$KILN_BIN
else
    echo "==> building kiln (release)"
    cargo build --release --quiet --manifest-path "$here/Cargo.toml" -p kiln
    kiln="$CARGO_TARGET_DIR/release/kiln"
fi

echo "==> making a git repository from examples/images"
rm -rf "$work/images"
cp -r "$here/examples/images" "$work/images"
sed -i "s|REGISTRY|$KILN_TEST_REGISTRY|g" "$work/images/.kiln/pipeline.yaml" "$work/images/ci/image/Dockerfile"
git -C "$work/images" init -q -b main
git -C "$work/images" add .
git -C "$work/images" -c user.name=demo -c user.email=demo@kiln.invalid commit -q -m "two-image pipeline"

echo "==> starting kiln server and a container agent (data in $work)"
"$kiln" server --data-dir "$work/data" --listen "$listen" --insecure-registry "$KILN_TEST_REGISTRY" >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 100); do [ -s "$work/data/agent.token" ] && grep -q listening "$work/server.log" && break; sleep 0.1; done
export KILN_SERVER=http://$listen KILN_TOKEN=$(cat "$work/data/admin.token")
"$kiln" agent --server "$KILN_SERVER" --token-file "$work/data/agent.token" --name images-agent \
    --work-dir "$work/agent" --executor container --engine "$KILN_ENGINE" >"$work/agent.log" 2>&1 &
agent=$!

"$kiln" repo add images --url "$work/images"
echo "==> kiln run --repo images --commit main --follow"
set +e
"$kiln" run --repo images --commit main --follow
rc=$?
set -e
cat <<MSG

Finished with exit code $rc. Kiln is still running (server pid $server, agent pid $agent):
  export KILN_SERVER=$KILN_SERVER KILN_TOKEN=$KILN_TOKEN
  $kiln status RUN --json      # each job's image_digest
  logs: $work/server.log $work/agent.log
Stop it with: kill $agent $server
MSG
exit $rc
