#!/usr/bin/env bash
# Set up the virtualenv (scripts/setup_env.sh) and run the WHOLE test suite, slow tests included.
# Extra arguments go to pytest (e.g. `-m "not slow"` for the fast subset).
#
# The suite runs on TEST_WORKERS pytest-xdist workers (default 2), each test file whole on one
# worker (--dist loadfile: a file's module fixtures and its order are kept), the files with slow
# tests handed out first (tests/conftest.py). Two workers on two cores: much of the suite waits
# (process and Ray start-ups, rendezvous, subprocess timeouts), and the other worker fills that
# time (docs/benchmarks.md, "Test suite: time"). TEST_WORKERS=0 runs in one process, in file order;
# an explicit `-n N` or `-p no:xdist` among the arguments wins.
set -uo pipefail
cd "$(dirname "$0")/.."
# STACK=primary|compat: that stack (scripts/setup_env.sh). The default stack (DEFAULT_STACK there)
# runs the whole suite in .venv; the other one, asked for by STACK, is built in .venv-STACK and
# runs the subset of tests/stack_subset.txt unless test paths are given: CI runs both (.ci/run).
default_stack=$(sed -n 's/^DEFAULT_STACK=//p' scripts/setup_env.sh)
second=""
if [ -n "${STACK:-}" ] && [ "$STACK" != "$default_stack" ]; then second=1; export VENV=${VENV:-.venv-$STACK}; fi
bash scripts/setup_env.sh || exit 1
VENV=${VENV:-.venv}
has_path=0  # test paths among the arguments (a file or directory, maybe with ::test): those only
for a in "$@"; do case "$a" in -*) ;; *) if [ -e "${a%%::*}" ]; then has_path=1; fi;; esac; done
if [ $has_path -eq 1 ]; then
  paths=()
elif [ -n "$second" ]; then
  mapfile -t paths < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' tests/stack_subset.txt | grep -v '^$')
else
  paths=(tests)
fi
WORKERS=${TEST_WORKERS:-2}
# Byte-compile the project once: every gloo rank, Ray actor and driver subprocess of the suite
# imports it, and where PYTHONDONTWRITEBYTECODE is set (as on these machines) each would compile
# its 26k lines again (about 1.9 s of CPU per process, measured; docs/benchmarks-log.md, "Suite time
# on an AMD EPYC"). __pycache__ is git-ignored; Python recompiles a file whose source changed.
"$VENV/bin/python" -m compileall -q -j 0 megatron_dapo tests tools benchmarks >/dev/null || true
# PyTorch's CPU tensors of 2 MiB or more on transparent huge pages, read once per process at its
# first allocation: exported here for the pytest processes (tests/conftest.py, "Page faults").
export THP_MEM_ALLOC_ENABLE="${THP_MEM_ALLOC_ENABLE:-1}"
case "$WORKERS" in ''|*[!0-9]*) echo "[tests] TEST_WORKERS must be a whole number (0: no workers), got '$WORKERS'" >&2; exit 2;; esac
xdist=()
if [ "$WORKERS" -gt 0 ] && [[ " $* " != *" -n "* && " $* " != *" -n="* && " $* " != *"no:xdist"* ]]; then
  xdist=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder)
fi
"$VENV/bin/python" -m pytest "${paths[@]}" "${xdist[@]}" "$@"
rc=$?
# pytest exits 5 when it collected no test: that is a failure of the suite, not a pass.
if [ $rc -eq 5 ]; then echo "[tests] pytest collected no tests" >&2; exit 1; fi
exit $rc
