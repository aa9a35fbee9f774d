#!/usr/bin/env bash
# One test in two trees of the project, alternating, alone on the machine: wall time and busy
# CPU-seconds of the whole machine (/proc/stat) for each run, with one interpreter for both.
#
#   bash benchmarks/ab_trees.sh OLD_TREE NEW_TREE TEST_ID [ROUNDS=2] [PYTHON=.venv/bin/python]
#
# e.g. OLD_TREE a `git worktree add /tmp/old 19740e6`; each tree is byte-compiled first (where
# PYTHONDONTWRITEBYTECODE is set, a tree without bytecode pays to compile in every process).
# Prints "TREE runN rc=R wall=S busy_cpu_s=C" per run.
set -uo pipefail
old=$1 new=$2 test=$3 rounds=${4:-2}
py=${5:-.venv/bin/python}
py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"  # absolute, the venv's link kept
for d in "$old" "$new"; do (cd "$d" && "$py" -m compileall -q -j 0 megatron_dapo tests >/dev/null); done
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
for i in $(seq "$rounds"); do
  for d in "$old" "$new"; do
    cd "$d" || exit 2
    s=$(date +%s.%N); c0=$(busy)
    THP_MEM_ALLOC_ENABLE=1 "$py" -m pytest -q -p no:xdist -p no:cacheprovider "$test" >/dev/null 2>&1
    rc=$?
    c1=$(busy); e=$(date +%s.%N)
    echo "$d run$i rc=$rc wall=$(echo "$e - $s" | bc) busy_cpu_s=$(( (c1 - c0) / $(getconf CLK_TCK) ))"
  done
done
