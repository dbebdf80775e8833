#!/usr/bin/env bash
# gpu_worker trains an exported MLP on tabular .npy features of 300 classes
# (tests/tabular_e2e_test.py), with Debian's python3-torch (tools/setup.sh installs it; without
# it this test fails, it never skips).
source "$(dirname "$0")/testlib.sh"
PYTHON=/usr/bin/python3
"$PYTHON" -c "import torch" 2>/dev/null ||
  die "python3-torch missing for $PYTHON (tools/setup.sh installs it)"
export DPTRAIN_ROOT="$ROOT"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" "$ROOT/tests/tabular_e2e_test.py" "$@"
