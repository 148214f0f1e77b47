#!/usr/bin/env bash
# The README's test command: installs what is missing (scripts/setup.sh), builds every test binary
# of the workspace once in the release profile, runs them a few at a time (the fault suites that
# wait on timeouts beside the CPU-bound ones), and prints where the time went
# (scripts/run-tests.py; docs/testing.md says how to run one crate, one suite, the long runs).
#   scripts/test.sh [-p CRATE]... [--jobs N] [-- ARGS FOR EACH TEST BINARY]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
began=$SECONDS
./scripts/setup.sh
exec python3 scripts/run-tests.py --setup-seconds "$((SECONDS - began))" "$@"
