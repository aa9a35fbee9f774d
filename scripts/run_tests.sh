#!/usr/bin/env bash
# Set up the virtualenv (scripts/setup_env.sh) and run the WHOLE test suite, slow tests included.
# Extra arguments go to pytest (e.g. `-m "not slow"` for the fast subset).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh || exit 1
VENV=${VENV:-.venv}
"$VENV/bin/python" -m pytest tests "$@"
rc=$?
# pytest exits 5 when it collected no test: that is a failure of the suite, not a pass.
if [ $rc -eq 5 ]; then echo "[tests] pytest collected no tests" >&2; exit 1; fi
exit $rc
