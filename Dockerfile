# One image with the service binaries (inference-server, allocator, control-service, and their
# clients inference-client and vmreplay, the `replay` package's); docker-compose.yml picks the binary
# per service.
FROM rust:1-bookworm AS build
WORKDIR /src
# Prerequisites in a layer of their own, so that editing the sources does not reinstall them. Only
# what the services' build needs (a C compiler for SQLite): they link no LightGBM, so no CMake or
# libclang, and the tests' tools have no use in the image.
COPY scripts/setup.sh scripts/setup.sh
RUN ./scripts/setup.sh --run
COPY . .
# The cache mounts keep downloaded crates and the target directory from one image build to the
# next. The target directory is a cache, not part
# of the layer, so the binaries are copied out of it in the same step. --locked: the image is built
# from exactly the checked-in Cargo.lock.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins -p inference-server -p allocator -p control-service -p replay \
    && mkdir -p /out \
    && find target/release -maxdepth 1 -type f -executable -exec cp {} /out/ \;

FROM debian:bookworm-slim
# curl: the health checks of docker-compose.yml; ca-certificates: HTTPS clients.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
# The services run unprivileged. /var/lib/lava is the allocator's state directory and
# /run/lava-secrets holds the generated service token (docker-compose.yml): a new named volume
# mounted there takes this ownership.
RUN useradd --system --user-group --uid 10001 --home-dir /var/lib/lava --no-create-home lava \
    && mkdir -p /var/lib/lava /run/lava-secrets \
    && chown lava:lava /var/lib/lava /run/lava-secrets
COPY --from=build /out/ /usr/local/bin/
# Built-in defaults, so the image also runs without docker-compose.yml; the compose file mounts the
# checked-in configs/ and models/ over them.
COPY configs /etc/lava
COPY models /models
USER lava
WORKDIR /var/lib/lava
EXPOSE 8080 8081 8082
