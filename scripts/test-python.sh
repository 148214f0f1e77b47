#!/usr/bin/env bash
# The Python package's tests (python/tests, the example notebook included), as e2e/tests/python.rs
# runs them from the README's test command (scripts/test.sh) and `cargo test --release --workspace`:
#   1. builds the wheel with maturin from this workspace, in its release profile and target
#      directory ($CARGO_TARGET_DIR, default target/), so it reuses the workspace's build;
#   2. installs it into a throwaway venv that sees the interpreter's own packages (pandas, pyarrow,
#      pytest, nbclient, ... which scripts/setup.sh installs), with no network;
#   3. runs pytest there, with the workspace's release binaries for the CLI and service parity tests.
# Extra arguments go to pytest (e.g. -k parity).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
die() { echo "test-python: ERROR: $*" >&2; exit 1; }

TARGET=${CARGO_TARGET_DIR:-$PWD/target}
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; install python3 (scripts/setup.sh does)"
missing=$("$PYTHON" - <<'PY'
import importlib.util
need = ["maturin", "numpy", "pandas", "pyarrow", "pytest", "nbclient", "nbformat", "ipykernel", "matplotlib"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PY
)
[ -z "$missing" ] || die "missing Python packages: $missing; run ./scripts/setup.sh (it installs them from PyPI)"

WHEELS="$TARGET/python-wheels"
VENV="$TARGET/python-venv"
rm -rf "$WHEELS" "$VENV"
echo "test-python: building the wheel (maturin, release profile, target $TARGET)"
CARGO_TARGET_DIR="$TARGET" "$PYTHON" -m maturin build --release --manifest-path python/Cargo.toml \
    --features reuse-workspace-build --out "$WHEELS" --interpreter "$PYTHON"
"$PYTHON" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps "$WHEELS"/*.whl
echo "test-python: running pytest"
# From the tests folder: `python -m` puts the working directory on sys.path, and python/ holds the
# package's sources without their native module.
cd python/tests
LIFETIME_ALLOC_BIN_DIR="$TARGET/release" MPLBACKEND=Agg "$VENV/bin/python" -m pytest . -p no:cacheprovider "$@"
