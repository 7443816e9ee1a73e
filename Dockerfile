# syntax=docker/dockerfile:1
#
# One image with oncely's shipped binaries — oncely-worker (migrate | run | reconcile |
# admin), oncely-producer and oncely-gateway (the agents' front door) — plus oncely-sandbox
# (the stand-in providers the compose fleet runs; a separate program, not linked into the
# others) and the default config at /etc/oncely/oncely.toml. Pick the process with the command, e.g.
#
#   docker build -t oncely .
#   docker run --rm oncely oncely-worker --help
#
# docker-compose.yml builds it for the whole fleet. TLS (to providers, Postgres and
# RabbitMQ) is rustls on ring:
# no OpenSSL is linked (see Cargo.toml).

ARG RUST_VERSION=1.94

# ---- build -----------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and the target dir between builds (BuildKit); the
# binaries are copied out in the same step because the cached target dir is not in the layer.
# Each program is built on its own (`-p`), so Cargo's feature unification across the
# workspace cannot pull test features (the chaos run's fail points) into a shipped binary.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p oncely-worker --bin oncely-worker \
 && cargo build --release --locked -p oncely-producer --bin oncely-producer \
 && cargo build --release --locked -p oncely-gateway --bin oncely-gateway \
 && cargo build --release --locked -p oncely-sandbox --bin oncely-sandbox \
 && mkdir -p /out \
 && cp target/release/oncely-worker target/release/oncely-producer target/release/oncely-gateway \
       target/release/oncely-sandbox /out/

# ---- runtime ---------------------------------------------------------------------------
FROM debian:bookworm-slim AS runtime
# curl: for health checks only (GET /healthz on the sandbox, /metrics on workers).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 oncely \
 && useradd --system --uid 10001 --gid oncely --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin oncely
COPY --from=build /out/ /usr/local/bin/
COPY config/ /etc/oncely/
ENV ONCELY_CONFIG=/etc/oncely/oncely.toml \
    ONCELY_LOG_FORMAT=json \
    RUST_LOG=info
USER oncely:oncely
# Metrics (oncely-worker run / reconcile with --metrics-addr / ONCELY_METRICS_ADDR), the
# sandbox's default port in the compose file, the gateway's API and ops listener.
EXPOSE 9464 8085 8080 9465
# The binaries handle SIGTERM themselves (finish in-flight work, then exit 0).
STOPSIGNAL SIGTERM
CMD ["oncely-worker", "run"]
