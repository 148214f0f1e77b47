# One image with every binary of the workspace; docker-compose.yml picks the binary per service.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN ./scripts/setup.sh && cargo build --release --workspace --bins \
    && find target/release -maxdepth 1 -type f -executable -exec cp {} /usr/local/bin/ \;

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/ /usr/local/bin/
COPY models /models
