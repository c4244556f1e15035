#!/bin/sh
# "Compiles" the app inside the base image: target/app.jar is a shell script.
set -eu
mkdir -p target
printf '#!/bin/sh\necho "hello from app.jar built at %s"\n' "${KILN_COMMIT:-unknown}" > target/app.jar
sha256sum target/app.jar
