#!/usr/bin/env bash
# dptrain.torch end to end (tests/torch_workers_test.py): real PyTorch scripts as workers of
# the real ps_server, the ring and the master reducer, with Debian's python3-torch on the CPU
# (tools/setup.sh installs it; without it this test fails, it never skips).
source "$(dirname "$0")/testlib.sh"
PYTHON=/usr/bin/python3
"$PYTHON" -c "import torch" 2>/dev/null ||
  die "python3-torch missing for $PYTHON (tools/setup.sh installs it)"
export DPTRAIN_ROOT="$ROOT"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export DPTRAIN_NATIVE_LIB="$ROOT/python/native/libdptrain_c.so"
exec "$PYTHON" "$ROOT/tests/torch_workers_test.py" "$@"
