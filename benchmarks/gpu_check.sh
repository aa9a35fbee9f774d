#!/usr/bin/env bash
# GPU check of the hybrid engine on one GPU without network access (e.g. one H200).
#
# That machine has Python 3.12 and torch but no megatron-core: the megatron-core wheel for
# Python 3.12 is carried in .whl/ (git-ignored; carry it: `carry: [".whl"]`) and installed
# with `pip install --no-index --no-deps --target` into a scratch directory. numpy and
# packaging (megatron-core's only import-time requirements besides torch) are installed
# from .whl/ too, but only when the machine lacks them. Prepare .whl/ on a networked machine:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     megatron-core==0.16.1 numpy==2.2.6 packaging==25.0
#
# Then: bash benchmarks/gpu_check.sh [gpu_check.py options, e.g. --layers 3]
# Exit code: 0 when every section passed; 2 setup failed; otherwise the failures of gpu_check.py.
# Then benchmarks/gpu_dapo_step.py: one real DAPO step of the trainer's own code in bf16 (transformers
# and safetensors are on that machine). SGLang is not exercised (its wheels are too large to carry).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
SITE="${GPU_CHECK_SITE:-/tmp/gpu_check_site}"
WHL="${REPO}/.whl"
cd "${REPO}"

echo "===== setup: machine ====="
date -u
uname -a
"${PY}" --version
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv || echo "nvidia-smi unavailable"
free -g || true

echo "===== setup: torch ====="
if ! "${PY}" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"; then
    echo "SETUP FAILED: torch does not import with ${PY}"
    exit 2
fi

echo "===== setup: megatron-core wheel ====="
shopt -s nullglob
MCORE=("${WHL}"/megatron_core-*-cp312-*.whl)
if [ "${#MCORE[@]}" -ne 1 ]; then
    echo "SETUP FAILED: expected exactly one megatron_core cp312 wheel in ${WHL}, found ${#MCORE[@]} (was .whl carried?)"
    ls -la "${WHL}" || true
    exit 2
fi
rm -rf "${SITE}"
mkdir -p "${SITE}"
install_wheel() {
    # pip when the machine has it; otherwise unpack the wheel (a zip) into the target.
    if "${PY}" -m pip --version >/dev/null 2>&1; then
        "${PY}" -m pip install --no-index --no-deps --no-compile --target "${SITE}" "$1"
    else
        echo "pip unavailable: unpacking $1"
        "${PY}" -m zipfile -e "$1" "${SITE}"
    fi
}
install_wheel "${MCORE[0]}"
for dep in numpy packaging; do
    if "${PY}" -c "import ${dep}" 2>/dev/null; then
        echo "${dep}: present on the machine"
    else
        DEPW=("${WHL}"/${dep}-*.whl)
        if [ "${#DEPW[@]}" -lt 1 ]; then
            echo "SETUP FAILED: ${dep} missing on the machine and no ${dep} wheel in ${WHL}"
            exit 2
        fi
        echo "${dep}: missing, installing ${DEPW[0]}"
        install_wheel "${DEPW[0]}"
    fi
done
export PYTHONPATH="${SITE}:${REPO}${PYTHONPATH:+:${PYTHONPATH}}"
export CUDA_DEVICE_MAX_CONNECTIONS=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
if ! "${PY}" -c "import megatron.core, setuptools; print('megatron-core', megatron.core.__version__, 'at', megatron.core.__file__)"; then
    echo "SETUP FAILED: megatron.core (or setuptools, needed by torch.utils.cpp_extension) does not import"
    exit 2
fi

echo "===== check: benchmarks/gpu_check.py $* ====="
set +e
"${PY}" "${REPO}/benchmarks/gpu_check.py" "$@"
RC=$?
set -e
echo "===== done: gpu_check.py exit code ${RC} (0 = all sections passed) ====="

echo "===== check: benchmarks/gpu_dapo_step.py (one DAPO step of the trainer's code, bf16, hybrid step into an HF engine) ====="
set +e
"${PY}" "${REPO}/benchmarks/gpu_dapo_step.py"
RC2=$?
set -e
echo "===== done: gpu_dapo_step.py exit code ${RC2} ====="
echo "===== check: benchmarks/gpu_feed_check.py (two trainer ranks feed one TP-2 engine by CUDA IPC handles) ====="
set +e
"${PY}" "${REPO}/benchmarks/gpu_feed_check.py" --bucket-kb 4096
RC3=$?
set -e
echo "===== done: gpu_feed_check.py exit code ${RC3} ====="
echo "SGLang is not exercised by this check (benchmarks/sglang_smoke.py and gpu_feed_check.py --engine sglang are for a machine that has it)."
exit $(( RC + RC2 + RC3 ))
