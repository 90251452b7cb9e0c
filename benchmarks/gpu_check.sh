#!/usr/bin/env bash
# The cuda backend's GPU check, bounded by a timeout (see benchmarks/README.md).
#   bash benchmarks/gpu_check.sh [--wheels DIR] [--out DIR] [--scale F]
# GPU_CHECK_TIMEOUT (seconds, default 540) bounds the whole run; on expiry the script gets
# SIGTERM, stops its current step and still writes the report of the steps it finished.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
exec timeout --signal=TERM --kill-after=30 "${GPU_CHECK_TIMEOUT:-540}" \
    "${PYTHON:-python3}" benchmarks/gpu_check.py "$@"
