#!/usr/bin/env bash
# Installs the build prerequisites that are missing, and nothing that is present:
#   CMake >= 3.28 (lightgbm3 builds LightGBM from source), libclang + a C++ compiler
#   (bindgen / LightGBM), the rustfmt + clippy components (CI lints), and schemathesis (the API
#   fuzzer of control-service/tests/it/api_fuzz.rs), PostgreSQL (the allocator's multi-agent store),
#   Patroni and etcd (the store's automatic failover: allocator/tests/it/patroni_failover.rs),
#   Debian's Chromium and ChromeDriver (the dashboard's browser test,
#   control-service/tests/it/dashboard.rs), and the Python packages the Python package's tests need
#   (maturin, pandas, pyarrow, pytest, nbclient, ...; scripts/test-python.sh), and OpenStack Nova
#   34 with Placement 16, and Watcher 17, in venvs of their own for the plug-ins' tests
#   (scripts/openstack-env.sh).
# Safe to re-run; runs unattended (no stdin needed) from any directory.
#   --build-only: only what building the trainer (`lifetime-train`, LightGBM's C++) needs: CMake,
#   libclang, a C++ compiler. The default model's training and the Dockerfile's build stage use it.
#   --run: only what the README's main job runs (scripts/demo.sh): a C compiler (the embedded
#   store's SQLite), curl and python3. The services link no LightGBM, so no CMake or libclang; no
#   browser, PostgreSQL or fuzzer either.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."   # so a rust-toolchain override in the repo applies

MIN_CMAKE=3.28
say() { echo "setup: $*"; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }
MODE=all
case "${1:-}" in
    --build-only) MODE=build ;;
    --run) MODE=run ;;
    "") ;;
    *) die "usage: $0 [--build-only | --run]" ;;
esac

# Root privileges only when actually needed: directly as root, else via sudo if it exists.
if [ "$(id -u)" -eq 0 ]; then AS_ROOT=(); elif command -v sudo >/dev/null; then AS_ROOT=(sudo); else AS_ROOT=(false); fi
as_root() { [ "${AS_ROOT[0]:-}" != false ] || return 1; "${AS_ROOT[@]}" "$@"; }

APT_UPDATED=0
apt_install() {
    [ "${AS_ROOT[0]:-}" != false ] || die "not root and no sudo; please run: apt-get install -y $*"
    if [ "$APT_UPDATED" -eq 0 ]; then as_root apt-get update -q; APT_UPDATED=1; fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

# Look cmake up with pyenv shim dirs dropped from PATH: CI shells started with a plain system
# PATH cannot see shims, so only a cmake outside them counts.
NOSHIM_PATH=$(tr ':' '\n' <<<"$PATH" | grep -v '/shims/\?$' | paste -sd:)
cmake_path() { (PATH=$NOSHIM_PATH; command -v cmake); }
cmake_ver() { "$(cmake_path)" --version 2>/dev/null | awk 'NR==1 {print $3}'; }
good_cmake() { cmake_path >/dev/null && version_ge "$(cmake_ver)" "$MIN_CMAKE"; }

# --- 1. CMake >= 3.28 (Debian bookworm ships 3.25, so take the PyPI wheel) ---------------
if [ "$MODE" = run ]; then
    : # the services build no C++: LightGBM is the trainer's alone
elif good_cmake; then
    say "cmake $(cmake_ver) present ($(cmake_path))"
else
    say "cmake >= $MIN_CMAKE missing, installing via pip"
    python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
    # BREAK_SYSTEM_PACKAGES: Debian's own python refuses pip installs (PEP 668) without it.
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore \
        python3 -m pip install -q --disable-pip-version-check "cmake>=$MIN_CMAKE"
    # pip may put cmake in a dir that later shells don't have on PATH (e.g. a pyenv version
    # dir): expose the real binaries in /usr/local/bin, without clobbering real files there.
    bin_dir=$(python3 -c 'import cmake; print(cmake.CMAKE_BIN_DIR)')
    for tool in cmake ctest cpack; do
        dst=/usr/local/bin/$tool
        if [ -x "$bin_dir/$tool" ] && { [ -L "$dst" ] || [ ! -e "$dst" ]; }; then
            as_root ln -sf "$bin_dir/$tool" "$dst" || say "cannot link $dst (no root); add $bin_dir to PATH"
        fi
    done
    hash -r
    good_cmake || die "cmake >= $MIN_CMAKE still not found on PATH (found: $(cmake_path || echo none)); pip put it in $bin_dir"
    say "cmake $(cmake_ver) installed ($(cmake_path))"
fi

# --- 2. libclang (bindgen loads it at build time) and a C++ compiler ---------------------
# Note: libclang-cpp*.so is a different library and does not satisfy bindgen.
have_libclang() {
    grep -q 'libclang\(-[0-9.]*\)\?\.so' <<<"$(PATH="$PATH:/usr/sbin:/sbin" ldconfig -p 2>/dev/null)" ||
        compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null ||
        compgen -G '/usr/lib/llvm-*/lib/libclang-[0-9]*.so*' >/dev/null
}
if [ "$MODE" = run ]; then
    # The embedded store's SQLite (rusqlite, bundled) is C, built by the cc crate.
    if command -v cc >/dev/null || command -v gcc >/dev/null; then
        say "C compiler present"
    else
        say "C compiler missing, installing gcc"; apt_install gcc libc6-dev
    fi
else
    if have_libclang; then say "libclang present"; else say "libclang missing, installing libclang-dev"; apt_install libclang-dev; fi
    if command -v c++ >/dev/null || command -v g++ >/dev/null; then
        say "C++ compiler present"
    else
        say "C++ compiler missing, installing g++"; apt_install g++
    fi
fi

if [ "$MODE" = build ]; then say "build prerequisites present (--build-only)"; exit 0; fi

# --- 3. curl and python3 (the demo waits for readiness with curl and picks free ports with python3)
for tool in curl python3; do
    if command -v "$tool" >/dev/null; then say "$tool present"; else say "$tool missing, installing"; apt_install "$tool"; fi
done
if [ "$MODE" = run ]; then say "what the main job runs is present (--run)"; exit 0; fi

# --- 4. rustfmt and clippy ----------------------------------------------------------------
command -v cargo >/dev/null || die "cargo not found; install Rust with rustup (https://rustup.rs)"
if cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1; then
    say "rustfmt and clippy present"
else
    say "rustfmt/clippy missing, installing via rustup"
    rustup component add rustfmt clippy || die "'rustup component add rustfmt clippy' failed"
fi

# --- 5. schemathesis (the API fuzzer of control-service/tests/it/api_fuzz.rs) --------------------
# Pinned: its CLI changed a lot between 3.x and 4.x. Like cmake, it must be reachable from a plain
# PATH without pyenv shims, so the real entry point is linked into /usr/local/bin.
SCHEMATHESIS_VERSION=4.32.5
schemathesis_path() { (PATH=$NOSHIM_PATH; command -v schemathesis); }
schemathesis_ver() { "$(schemathesis_path)" --version 2>/dev/null | awk '{print $NF}' | sed 's/^v//'; }
if schemathesis_path >/dev/null && [ "$(schemathesis_ver)" = "$SCHEMATHESIS_VERSION" ]; then
    say "schemathesis $SCHEMATHESIS_VERSION present ($(schemathesis_path))"
else
    say "schemathesis $SCHEMATHESIS_VERSION missing, installing via pip"
    python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore \
        python3 -m pip install -q --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
    # pip's console script sits beside the interpreter that ran pip (a pyenv version's bin dir, say).
    script_dir=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
    for tool in schemathesis st; do
        dst=/usr/local/bin/$tool
        if [ -x "$script_dir/$tool" ] && [ "$script_dir/$tool" != "$dst" ] && { [ -L "$dst" ] || [ ! -e "$dst" ]; }; then
            as_root ln -sf "$script_dir/$tool" "$dst" || say "cannot link $dst (no root); add $script_dir to PATH"
        fi
    done
    hash -r
    [ "$(schemathesis_ver)" = "$SCHEMATHESIS_VERSION" ] ||
        die "schemathesis $SCHEMATHESIS_VERSION still not found on PATH (found: $(schemathesis_path || echo none)); pip put it in $script_dir"
    say "schemathesis $SCHEMATHESIS_VERSION installed ($(schemathesis_path))"
fi

# --- 6. PostgreSQL (the multi-agent placement store; its tests start throwaway clusters) ------
# Debian's server package: initdb and pg_ctl under /usr/lib/postgresql/VERSION/bin, and the
# unprivileged `postgres` user that a cluster started by root runs as. The package's own cluster
# service is not needed (tests and stack.sh start their own), so it is left as the package sets it.
pg_bin() { compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || (PATH=$NOSHIM_PATH; command -v pg_ctl) >/dev/null; }
if pg_bin && id postgres >/dev/null 2>&1 && command -v psql >/dev/null; then
    say "PostgreSQL present ($(psql --version))"
else
    say "PostgreSQL missing, installing Debian's postgresql"
    apt_install postgresql postgresql-client
    pg_bin || die "postgresql installed but pg_ctl not found under /usr/lib/postgresql/*/bin"
    say "PostgreSQL installed ($(psql --version))"
fi
command -v runuser >/dev/null || [ "$(id -u)" -ne 0 ] || apt_install util-linux

# --- 6b. Patroni and etcd (the zone's PostgreSQL with automatic failover, issue 44) ---------------
# Debian's packages: patroni (3.0.2 on bookworm; its etcd3 client is its own, over etcd's v3 JSON
# gateway) and etcd-server (3.4). The failover tests (allocator/tests/it/patroni_failover.rs) and
# `scripts/stack.sh up --agents N --patroni` start their own etcd and Patroni nodes, so the
# packages' services are disabled: an etcd on the default ports would only be in the way.
# (In containers without systemd, policy-rc.d already keeps them from starting.)
if command -v patroni >/dev/null && command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
    say "Patroni and etcd present ($(patroni --version), $(etcd --version | head -n 1))"
else
    say "Patroni or etcd missing, installing Debian's patroni, etcd-server and etcd-client"
    apt_install patroni etcd-server etcd-client
    command -v patroni >/dev/null && command -v etcd >/dev/null ||
        die "patroni and etcd-server installed but patroni or etcd is not on PATH"
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
        for unit in etcd patroni; do
            as_root systemctl disable --now "$unit" >/dev/null 2>&1 || true
        done
    fi
    say "Patroni and etcd installed ($(patroni --version), $(etcd --version | head -n 1))"
fi
command -v setpriv >/dev/null || [ "$(id -u)" -ne 0 ] || apt_install util-linux

# --- 7. Chromium and ChromeDriver (the dashboard's browser test) ----------------------------
# control-service/tests/it/dashboard.rs drives the dashboard in headless Chromium over WebDriver.
# Debian's packages, never a test tool's own browser download (the network is closed to those);
# the test finds chromium and chromedriver on PATH (or at $CHROMIUM and $CHROMEDRIVER).
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    say "Chromium and ChromeDriver present ($(chromedriver --version | awk '{print $1, $2}'))"
else
    say "Chromium or ChromeDriver missing, installing Debian's chromium and chromium-driver"
    apt_install chromium chromium-driver
    command -v chromium >/dev/null && command -v chromedriver >/dev/null ||
        die "chromium and chromium-driver installed but chromium or chromedriver is not on PATH"
    say "Chromium and ChromeDriver installed ($(chromedriver --version | awk '{print $1, $2}'))"
fi

# --- 8. The Python package's tests (scripts/test-python.sh, from e2e/tests/python.rs) ----------
# maturin builds the wheel; pytest, nbclient/nbformat/ipykernel (the executed example notebook) and
# matplotlib (its plot) run the tests; numpy, pandas and pyarrow are the package's own dependencies.
# Installed into python3 like cmake above; the tests' throwaway venv sees them (--system-site-packages),
# and creating it needs ensurepip (Debian's python3-venv).
PY_TEST_PACKAGES=(maturin numpy pandas pyarrow pytest nbclient nbformat ipykernel matplotlib)
py_missing() {
    python3 - "$@" <<'PY'
import importlib.util, sys
print(" ".join(n for n in sys.argv[1:] if importlib.util.find_spec(n) is None))
PY
}
missing=$(py_missing "${PY_TEST_PACKAGES[@]}")
if [ -z "$missing" ]; then
    say "Python test packages present (${PY_TEST_PACKAGES[*]})"
else
    say "Python packages missing ($missing), installing via pip"
    python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
    # shellcheck disable=SC2086 # one package a word
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore \
        python3 -m pip install -q --disable-pip-version-check $missing
    missing=$(py_missing "${PY_TEST_PACKAGES[@]}")
    [ -z "$missing" ] || die "still missing after pip install: $missing"
    say "Python test packages installed"
fi
if python3 -c 'import ensurepip, venv' 2>/dev/null; then
    say "python3 venv present"
else
    say "python3 venv missing, installing python3-venv"; apt_install python3-venv
fi

# --- 9. OpenStack Nova, Placement and Watcher for the plug-ins' tests (e2e/tests/openstack.rs) --
# Two venvs (target/openstack/{nova,watcher}-venv, links into the user's cache) with the pinned
# package sets of nova 34.0.0 and openstack-placement 16.0.0, and of python-watcher 17.0.0
# (openstack/requirements/), and the plug-in; skipped when up to date (scripts/openstack-env.sh).
bash scripts/openstack-env.sh

say "all prerequisites present"
