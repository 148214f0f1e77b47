#!/usr/bin/env bash
# Builds the OpenStack test environment of the Nova plug-in (openstack/, docs/openstack.md): a venv
# at target/openstack/nova-venv holding the pinned package set of nova 34.0.0 and
# openstack-placement 16.0.0 (openstack/requirements/nova-34.txt, frozen from a working install:
# the registry's upper-constraints cannot be fetched here) and the plug-in itself, installed
# editable (its sources are the repository's, so editing them needs no re-run).
#
#   scripts/openstack-env.sh            create or update the venv; skipped when up to date
#   scripts/openstack-env.sh --force    rebuild it from scratch
#   scripts/openstack-env.sh --print    print the venv's python (for scripts; alone on stdout), building if needed
#
# Up to date = the stamp file in the venv holds the hash of the requirements, of the plug-in's
# pyproject.toml and of the python3 version. Nova's functional harness looks for api-paste.ini
# beside site-packages (SITE/etc/nova/api-paste.ini); the wheel installs it under VENV/etc/nova,
# so it is linked. Safe to re-run; unattended; takes about a minute the first time (pip).
# Environment: PYTHON (default python3, 3.10 or later), NOVA_VENV (default
# target/openstack/nova-venv), PIP_INDEX_URL and the like as pip reads them.
# The tests then run with:
#   target/openstack/nova-venv/bin/python -m unittest discover -s openstack/tests -t openstack -v
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "openstack-env: $*" >&2; }
die() { echo "openstack-env: ERROR: $*" >&2; exit 1; }

PYTHON="${PYTHON:-python3}"
VENV="${NOVA_VENV:-target/openstack/nova-venv}"
REQUIREMENTS=openstack/requirements/nova-34.txt
STAMP="$VENV/.lifetime-alloc-stamp"
FORCE=0
PRINT=0
case "${1:-}" in
    --force) FORCE=1 ;;
    --print) PRINT=1 ;;
    "") ;;
    *) die "usage: $0 [--force | --print]" ;;
esac

command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set PYTHON to a Python 3.10+ interpreter)"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "$PYTHON is older than 3.10; nova 34 needs 3.10 or later"
[ -f "$REQUIREMENTS" ] || die "$REQUIREMENTS is missing"

want="$( { sha256sum "$REQUIREMENTS" openstack/pyproject.toml | cut -d' ' -f1; "$PYTHON" -V 2>&1; } | sha256sum | cut -d' ' -f1)"

if [ "$FORCE" -eq 0 ] && [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
    [ "$PRINT" -eq 1 ] && echo "$VENV/bin/python"
    say "up to date: $VENV"
    exit 0
fi

if [ "$FORCE" -eq 1 ] || [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV" >&2
fi
rm -f "$STAMP"

say "installing the pinned set ($(grep -c '==' "$REQUIREMENTS") packages; about a minute)"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQUIREMENTS" >&2

say "installing lifetime-alloc-openstack (editable)"
# Built in pip's isolated build environment (setuptools from the index, as pip does by default).
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e openstack >&2

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PASTE="$(cd "$VENV" && pwd)/etc/nova/api-paste.ini"
[ -f "$PASTE" ] || die "$PASTE is missing: the nova wheel did not install its etc/ files"
mkdir -p "$SITE/etc/nova"
ln -sfn "$PASTE" "$SITE/etc/nova/api-paste.ini"

"$VENV/bin/python" -W ignore - <<'EOF'
import importlib
for name in ('nova', 'placement', 'lifetime_alloc_openstack.reconcile', 'lifetime_alloc_openstack.listener'):
    importlib.import_module(name)
EOF
echo "$want" > "$STAMP"
say "ready: $VENV ($("$VENV/bin/python" -c 'import importlib.metadata as m; print("nova", m.version("nova"), "placement", m.version("openstack-placement"))'))"
[ "$PRINT" -eq 1 ] && echo "$VENV/bin/python"
exit 0
