#!/usr/bin/env bash
# The test command: the default suite, then the slow tests. pytest's exit code 5 (no tests
# collected) is a failure here, not a pass, and so is a test skipped because a dependency
# that CI installs cannot be imported (tests/strict_imports.py).
set -uo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled
export LITELLM_LOCAL_MODEL_COST_MAP=True
# torch's OpenMP threads spin while they wait; beside Ray workers and model servers they stall
# each other (a tiny-model SFT test took 10 minutes instead of 48 s on a loaded machine)
export OMP_WAIT_POLICY=PASSIVE
export DRACO_GYM_STRICT_IMPORTS=1

run() {
  python -m pytest "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
  if [ "$rc" -ne 0 ]; then exit "$rc"; fi
}
run -q
run -q -m slow
