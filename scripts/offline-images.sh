#!/usr/bin/env bash
# ONLY FOR MACHINES WITHOUT AN IMAGE REGISTRY. Anywhere Docker can pull images, do not run this:
# `docker compose up -d --build` pulls the real `rust:1-bookworm` and `debian:bookworm-slim`.
#
# Builds local stand-ins for the two base images the Dockerfile names, from Debian's packages,
# tagged with those names, so that the unchanged Dockerfile and docker-compose.yml build on a
# machine whose Docker engine reaches no image registry (this project's own machines reach Debian's
# package mirror, crates.io and PyPI, but no registry of images; docs/operations.md, "The compose
# stack, run for real"):
#
#   debian:bookworm-slim  debootstrap --variant=minbase of Debian bookworm into a directory, with
#                         the mirror's bookworm, bookworm-updates and bookworm-security in its apt
#                         sources, imported with `docker import`. Like the real slim image it has
#                         apt, bash and useradd; unlike it, it keeps the man pages and docs (no
#                         dpkg path excludes), so it is larger. It also carries THIS MACHINE'S
#                         LOCALLY ADDED CA CERTIFICATES (/usr/local/share/ca-certificates/*.crt):
#                         where HTTPS to the package registries goes through a proxy whose CA only
#                         this machine trusts, pip and cargo inside the build need it too. They are
#                         taken up by update-ca-certificates whenever an image installs
#                         ca-certificates (both stand-ins and the Dockerfile's runtime stage do).
#   rust:1-bookworm       that image, plus the C toolchain and tools of the real image's base
#                         (gcc, g++, make, git, curl, pkg-config, python3), plus THIS MACHINE'S
#                         OWN RUST TOOLCHAIN, copied from $RUSTUP_HOME (the rustup toolchain that
#                         `rustc` runs here, without its HTML docs) and rustup itself: no toolchain
#                         can be downloaded here. The real image installs the latest stable Rust
#                         with rustup; this one is whatever this machine has. Same layout and
#                         environment as the real one: RUSTUP_HOME=/usr/local/rustup,
#                         CARGO_HOME=/usr/local/cargo, /usr/local/cargo/bin on PATH.
#
# Usage (as root, or a user who may run debootstrap and docker):
#
#   scripts/offline-images.sh          # build both, unless an image of that name already exists
#   scripts/offline-images.sh --force  # rebuild both
#
# Environment: DOCKER (the client; default `docker`), DEBIAN_MIRROR (default
# http://deb.debian.org/debian), OFFLINE_IMAGES_DIR (work directory; default
# target/offline-images, which .dockerignore keeps out of build contexts). Needs debootstrap
# (`apt-get install debootstrap`). Takes about 3 minutes here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DOCKER=${DOCKER:-docker}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WORK=${OFFLINE_IMAGES_DIR:-target/offline-images}
FORCE=0
case "${1:-}" in
    --force) FORCE=1 ;;
    "") ;;
    *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac
say() { echo "offline-images: $*"; }
die() { echo "offline-images: ERROR: $*" >&2; exit 1; }
have_image() { [ "$FORCE" -eq 0 ] && "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

command -v debootstrap >/dev/null || die "debootstrap missing: apt-get install debootstrap"
"$DOCKER" info >/dev/null 2>&1 || die "'$DOCKER info' fails: is the Docker engine running?"
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

# --- debian:bookworm-slim ------------------------------------------------------------------
if have_image debian:bookworm-slim; then
    say "debian:bookworm-slim present (--force rebuilds it)"
else
    rootfs=$WORK/bookworm-rootfs
    rm -rf "$rootfs"
    say "debootstrap --variant=minbase bookworm from $MIRROR"
    debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
        die "debootstrap failed; see $WORK/debootstrap.log"
    cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
EOF
    # As in the real image: apt keeps no downloaded packages, so layers that install some stay small.
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
EOF
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        say "adding this machine's local CA certificates: $(cd /usr/local/share/ca-certificates && echo *.crt)"
        mkdir -p "$rootfs/usr/local/share/ca-certificates"
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    fi
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log
    say "docker import -> debian:bookworm-slim"
    tar -C "$rootfs" --numeric-owner -c . | "$DOCKER" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' \
        --message "offline stand-in for debian:bookworm-slim (scripts/offline-images.sh)" \
        - debian:bookworm-slim >/dev/null
    rm -rf "$rootfs"
fi

# --- rust:1-bookworm -----------------------------------------------------------------------
if have_image rust:1-bookworm; then
    say "rust:1-bookworm present (--force rebuilds it)"
else
    command -v rustc >/dev/null || die "no rustc on this machine to copy into rust:1-bookworm"
    host_rustup=${RUSTUP_HOME:-$HOME/.rustup}
    toolchain=$(rustup show active-toolchain | awk '{print $1}')
    toolchain_dir=$(readlink -f "$host_rustup/toolchains/$toolchain")
    [ -x "$toolchain_dir/bin/cargo" ] || die "toolchain $toolchain not found at $toolchain_dir"
    ctx=$WORK/rust-context
    rm -rf "$ctx"
    mkdir -p "$ctx/rustup/toolchains" "$ctx/cargo/bin"
    say "copying this machine's Rust toolchain $toolchain ($(rustc --version)) without its docs"
    cp -a "$toolchain_dir" "$ctx/rustup/toolchains/$toolchain"
    rm -rf "$ctx/rustup/toolchains/$toolchain/share/doc"
    printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\nauto_self_update = "disable"\n' \
        "$toolchain" >"$ctx/rustup/settings.toml"
    cp "$(command -v rustup)" "$ctx/cargo/bin/rustup"
    for proxy in cargo rustc rustdoc rustfmt cargo-fmt cargo-clippy clippy-driver rust-gdb rust-lldb; do
        ln -s rustup "$ctx/cargo/bin/$proxy"
    done
    cat >"$ctx/Dockerfile" <<'EOF'
FROM debian:bookworm-slim
# The real rust:1-bookworm is built on buildpack-deps:bookworm; these are the parts of it a Rust
# build with C dependencies uses.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       ca-certificates curl git gcc g++ make libc6-dev pkg-config python3 procps xz-utils \
    && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY rustup /usr/local/rustup
COPY cargo /usr/local/cargo
RUN cargo --version && rustc --version && cargo fmt --version && cargo clippy --version
EOF
    say "docker build -> rust:1-bookworm"
    "$DOCKER" build -t rust:1-bookworm \
        --label "org.opencontainers.image.description=offline stand-in for rust:1-bookworm (scripts/offline-images.sh)" \
        "$ctx"
    rm -rf "$ctx"
fi

"$DOCKER" image ls --format '{{.Repository}}:{{.Tag}}  {{.ID}}  {{.Size}}' | grep -E '^(debian:bookworm-slim|rust:1-bookworm) '
say "done: the Dockerfile's base images are local (tagged as the real ones: do not push them)"
