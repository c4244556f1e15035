#!/bin/sh
# "Compiles" the example app: packs src/ into target/app.jar (a zip-free
# stand-in: a self-contained shell script) and checks its syntax.
set -eu
echo "building ${APP_NAME:-app} at commit ${KILN_COMMIT:-unknown}"
mkdir -p target
{ echo '#!/bin/sh'; cat src/greet.sh; echo 'greet "$@"'; } > target/app.jar
chmod +x target/app.jar
sh -n target/app.jar
sha256sum target/app.jar
echo "build ok"
