#!/usr/bin/env bash
# Starts Kiln on its embedded defaults (SQLite + local disk) with two local
# agents, registers the bundled example repository and runs its pipeline end
# to end, streaming the logs. Kiln keeps running afterwards so you can look.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/kiln-target}
listen=${KILN_DEMO_LISTEN:-127.0.0.1:7070}
work=${KILN_DEMO_DIR:-$(mktemp -d /tmp/kiln-demo.XXXXXX)}

echo "==> building kiln (release)"
cargo build --release --quiet --manifest-path "$here/Cargo.toml" -p kiln
kiln="$CARGO_TARGET_DIR/release/kiln"

echo "==> making a git repository from examples/hello"
rm -rf "$work/hello"
cp -r "$here/examples/hello" "$work/hello"
git -C "$work/hello" init -q -b main
git -C "$work/hello" add .
git -C "$work/hello" -c user.name=demo -c user.email=demo@kiln.invalid commit -q -m "example pipeline"

echo "==> starting kiln up (data in $work/data)"
"$kiln" up --data-dir "$work/data" --listen "$listen" --agents 2 >"$work/kiln-up.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
    grep -q '^export KILN_SERVER=' "$work/kiln-up.log" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/kiln-up.log"; exit 1; }
    sleep 0.1
done
eval "$(grep '^export KILN_SERVER=' "$work/kiln-up.log")"

"$kiln" repo add hello --url "$work/hello"
echo "==> kiln run --repo hello --commit main --follow"
set +e
"$kiln" run --repo hello --commit main --follow 2> >(tee "$work/run.err" >&2)
rc=$?
set -e
sleep 0.2
run=$(sed -n 's/^run \(.*\) accepted$/\1/p' "$work/run.err")
cat <<MSG

Run $run finished with exit code $rc.
Kiln is still running (pid $pid); look around:
  export KILN_SERVER=$KILN_SERVER KILN_TOKEN=$KILN_TOKEN
  $kiln status $run
  $kiln logs $run
  web UI:      $KILN_SERVER/
  server log:  $work/kiln-up.log
  data:        $work/data (kiln.db, tokens, agent state; 0700)
  one more agent (the token from a file, never an argument):
               $kiln agent --server $KILN_SERVER --token-file $work/data/agent.token --name extra
Stop it with: kill $pid
MSG
exit $rc
