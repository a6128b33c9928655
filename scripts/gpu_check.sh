#!/usr/bin/env bash
# speedkit's one prepared GPU check (see scripts/gpu_check.py): at most about 8 minutes on one GPU; writes one
# results folder (default runs/gpu-check) with summary.json and summary.md; exits 2 where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python}" scripts/gpu_check.py "$@"
