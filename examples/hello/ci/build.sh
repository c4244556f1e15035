#!/bin/sh
# "Compiles" the example app: assembles target/app.sh from src/ and checks its syntax.
set -eu
echo "building ${APP_NAME:-app} at commit ${KILN_COMMIT:-unknown}"
mkdir -p target
{ echo '#!/bin/sh'; cat src/greet.sh; echo 'greet "$@"'; } > target/app.sh
chmod +x target/app.sh
sh -n target/app.sh
sha256sum target/app.sh
echo "build ok"
