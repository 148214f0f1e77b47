#!/usr/bin/env bash
# Builds the OpenStack test environments of the plug-in (openstack/, docs/openstack.md), each a venv
# holding a pinned package set (frozen from a working install: the registry's upper-constraints
# cannot be fetched here) and the plug-in itself, installed editable (its sources are the
# repository's, so editing them needs no re-run):
#   nova     target/openstack/nova-venv: nova 34.0.0 and openstack-placement 16.0.0
#            (openstack/requirements/nova-34.txt), for the Nova weigher, listener and reconciliation;
#   watcher  target/openstack/watcher-venv: python-watcher 17.0.0 and the test libraries its
#            functional harness imports (openstack/requirements/watcher-17.txt), for the Watcher
#            strategy.
#
#   scripts/openstack-env.sh                   create or update both; each skipped when up to date
#   scripts/openstack-env.sh --force           rebuild both from scratch
#   scripts/openstack-env.sh --print NAME      print venv NAME's python (for scripts; alone on
#                                              stdout), building it if needed
#
# Each venv lives in the user's cache (LIFETIME_ALLOC_VENVS, default
# ~/.cache/lifetime-alloc/openstack), named by the hash of its pinned set and python, and the path
# above links to it: a fresh clone reuses it and installs only the plug-in again (when this clone's
# path or the plug-in's pyproject.toml differ from the last install). Nova's functional harness looks
# for api-paste.ini beside site-packages (SITE/etc/nova/api-paste.ini); the wheel installs it under
# VENV/etc/nova, so it is linked. Safe to re-run; unattended; takes about a minute a venv the first
# time (pip). Environment: PYTHON (default python3, 3.10 or later), NOVA_VENV (default
# target/openstack/nova-venv), WATCHER_VENV (default target/openstack/watcher-venv),
# LIFETIME_ALLOC_VENVS, PIP_INDEX_URL and the like as pip reads them.
# The tests then run with (docs/openstack.md):
#   target/openstack/nova-venv/bin/python -m unittest discover -s openstack/tests -t openstack -v
#   target/openstack/watcher-venv/bin/python -m unittest discover -s openstack/tests/watcher -t openstack -v
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "openstack-env: $*" >&2; }
die() { echo "openstack-env: ERROR: $*" >&2; exit 1; }

PYTHON="${PYTHON:-python3}"
FORCE=0
ONLY=""
case "${1:-}" in
    --force) FORCE=1 ;;
    --print)
        ONLY="${2:-}"
        [ "$ONLY" = nova ] || [ "$ONLY" = watcher ] || die "usage: $0 --print nova|watcher"
        ;;
    "") ;;
    *) die "usage: $0 [--force | --print nova|watcher]" ;;
esac

command -v "$PYTHON" >/dev/null || die "$PYTHON not found (set PYTHON to a Python 3.10+ interpreter)"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "$PYTHON is older than 3.10; nova 34 and watcher 17 need 3.10 or later"

# build_venv NAME LINK REQUIREMENTS MODULES...: the venv with the pinned set and the plug-in, at
# LINK; the modules are imported at the end as a check. The venv itself lives in the user's cache
# (VENVS), named by the hash of its pinned set and python, and LINK points at it: a fresh clone on
# a machine that built it once reuses it (as pip's and cargo's caches are), and only installs the
# plug-in (editable, from this clone) again.
build_venv() {
    local name="$1" link="$2" requirements="$3"
    shift 3
    [ -f "$requirements" ] || die "$requirements is missing"
    local base plugin venv
    base="$( { sha256sum "$requirements" | cut -d' ' -f1; "$PYTHON" -V 2>&1; command -v "$PYTHON"; } | sha256sum | cut -c1-16)"
    plugin="$( { sha256sum openstack/pyproject.toml | cut -d' ' -f1; pwd; } | sha256sum | cut -d' ' -f1)"
    venv="$VENVS/$name-$base"
    if [ "$FORCE" -eq 1 ] || [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.lifetime-alloc-base" ]; then
        say "creating $venv"
        rm -rf "$venv"
        mkdir -p "$VENVS"
        "$PYTHON" -m venv "$venv" >&2
        say "$name: installing the pinned set ($(grep -c '==' "$requirements") packages; about a minute)"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
        if [ "$name" = nova ]; then
            local site paste
            site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
            paste="$venv/etc/nova/api-paste.ini"
            [ -f "$paste" ] || die "$paste is missing: the nova wheel did not install its etc/ files"
            mkdir -p "$site/etc/nova"
            ln -sfn "$paste" "$site/etc/nova/api-paste.ini"
        fi
        touch "$venv/.lifetime-alloc-base"
    fi
    mkdir -p "$(dirname "$link")"
    # A venv an older version of this script built in place is replaced by the link.
    if [ -d "$link" ] && [ ! -L "$link" ]; then rm -rf "$link"; fi
    ln -sfn "$venv" "$link"
    if [ "$(cat "$venv/.lifetime-alloc-plugin" 2>/dev/null)" = "$plugin" ]; then
        say "up to date: $link -> $venv"
        return 0
    fi
    rm -f "$venv/.lifetime-alloc-plugin"
    say "$name: installing lifetime-alloc-openstack (editable, from $(pwd)/openstack)"
    # Built in pip's isolated build environment (setuptools from the index, as pip does by default).
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e openstack >&2
    "$venv/bin/python" -W ignore -c 'import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)' "$@" > /dev/null
    echo "$plugin" > "$venv/.lifetime-alloc-plugin"
    say "ready: $link -> $venv ($("$venv/bin/python" -c 'import importlib.metadata as m, sys
print(", ".join(n + " " + m.version(n) for n in sys.argv[1:]))' "${VERSIONS[@]}"))"
}

VENVS="${LIFETIME_ALLOC_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/lifetime-alloc/openstack}"
NOVA_VENV="${NOVA_VENV:-target/openstack/nova-venv}"
WATCHER_VENV="${WATCHER_VENV:-target/openstack/watcher-venv}"
if [ -z "$ONLY" ] || [ "$ONLY" = nova ]; then
    VERSIONS=(nova openstack-placement)
    build_venv nova "$NOVA_VENV" openstack/requirements/nova-34.txt \
        nova placement lifetime_alloc_openstack.reconcile lifetime_alloc_openstack.listener
fi
if [ -z "$ONLY" ] || [ "$ONLY" = watcher ]; then
    VERSIONS=(python-watcher)
    # watcher.tests.unit first: it sets up eventlet before any other Watcher module.
    build_venv watcher "$WATCHER_VENV" openstack/requirements/watcher-17.txt \
        watcher.tests.unit lifetime_alloc_openstack.watcher_strategy lifetime_alloc_openstack.consolidation
fi
case "$ONLY" in
    nova) echo "$NOVA_VENV/bin/python" ;;
    watcher) echo "$WATCHER_VENV/bin/python" ;;
esac
