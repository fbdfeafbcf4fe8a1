# acp-gateway container image.
#
#   docker build -t acp-gateway .            # compiles from source (multi-stage)
#   podman build --format docker -t acp-gateway --target runtime-prebuilt \
#     --build-context prebuilt=DIR .         # DIR/acp-gateway: a binary built elsewhere, e.g. on
#                                            # the host (what scripts/container-test.sh does)
#
# Stages: planner (a skeleton of the crate) → deps (dependencies only, cached until Cargo.toml or
# Cargo.lock change) → build (our code); runtime-base (everything but the binary) →
# runtime-prebuilt | runtime (the default target). BuildKit and buildah build only the stages the
# target needs. (`podman build --format docker` keeps the HEALTHCHECK; OCI images have none.)

ARG RUST_IMAGE=rust:1-bookworm
ARG DEBIAN_IMAGE=debian:bookworm-slim

# ---- planner: the manifests, with every target stubbed, so that the next stage's input changes
# when dependencies or targets change, never when code does (what cargo-chef does).
FROM ${RUST_IMAGE} AS planner
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
RUN set -eu; mkdir -p /skeleton/src; cp Cargo.toml Cargo.lock build.rs /skeleton/; \
    : > /skeleton/src/lib.rs; echo 'fn main() {}' > /skeleton/src/main.rs; \
    awk 'function flush() { if (kind != "") print (path != "" ? path : dir[kind] "/" name ".rs"); kind = name = path = "" } \
         BEGIN { dir["bin"] = "src/bin"; dir["bench"] = "benches"; dir["test"] = "tests"; dir["example"] = "examples" } \
         /^\[\[(bin|bench|test|example)\]\]/ { flush(); kind = $0; gsub(/[][ ]/, "", kind); next } \
         /^\[/ { flush(); next } \
         kind != "" && /^name *=/ { name = $0; sub(/^name *= *"/, "", name); sub(/".*/, "", name) } \
         kind != "" && /^path *=/ { path = $0; sub(/^path *= *"/, "", path); sub(/".*/, "", path) } \
         END { flush() }' Cargo.toml \
    | while read -r f; do mkdir -p "/skeleton/${f%/*}"; [ -e "/skeleton/$f" ] || echo 'fn main() {}' > "/skeleton/$f"; done

# ---- deps: compiles every dependency once; this layer is reused until the skeleton changes.
FROM ${RUST_IMAGE} AS deps
WORKDIR /src
COPY --from=planner /skeleton/ ./
RUN cargo build --profile dist --locked --bin acp-gateway

# ---- build: our code on top of the compiled dependencies.
FROM deps AS build
COPY src ./src
COPY migrations ./migrations
COPY static ./static
# COPY keeps the files' own mtimes, which may be older than the stub build: touch, so cargo
# rebuilds our crate. Debug line tables (77 MB of the binary's 100) stay out of the image.
RUN touch src/main.rs src/lib.rs build.rs \
    && cargo build --profile dist --locked --bin acp-gateway \
    && mkdir -p /out \
    && objcopy --strip-debug target/dist/acp-gateway /out/acp-gateway

# ---- runtime-base: the image without its binary.
FROM ${DEBIAN_IMAGE} AS runtime-base
# tini: PID 1 that reaps zombies and forwards SIGTERM (Kubernetes has no --init).
# bubblewrap: the agent sandbox (sandbox = "auto" uses it when it works in the container; what
# the container must allow for that: docs/operations.md, "Containers and Kubernetes").
# slirp4netns, iproute2: for agents with network = "egress-only" (the pod also needs
# /dev/net/tun; docs/security.md, "Tenancy").
# ca-certificates: for agents that call their model APIs over HTTPS.
# No curl: the HEALTHCHECK speaks HTTP with bash's /dev/tcp (bash is part of every Debian base).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        bubblewrap ca-certificates iproute2 slirp4netns tini \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && groupadd --gid 10001 acp \
    && useradd --uid 10001 --no-create-home --gid 10001 --home-dir /var/lib/acp-gateway --shell /usr/sbin/nologin acp \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/acp-gateway /var/lib/acp-gateway/data
COPY static /usr/share/acp-gateway/static
COPY deploy/container/healthcheck.sh /usr/local/bin/acp-gateway-healthcheck
# Numeric, so Kubernetes' runAsNonRoot can verify it without a securityContext.runAsUser.
USER 10001:10001
WORKDIR /var/lib/acp-gateway
ENV ACP_GATEWAY_LISTEN=0.0.0.0:8080 \
    ACP_GATEWAY_STATIC_DIR=/usr/share/acp-gateway/static \
    ACP_GATEWAY_DATA_DIR=/var/lib/acp-gateway/data \
    DATABASE_URL=sqlite:///var/lib/acp-gateway/data/acp-gateway.db \
    TINI_SUBREAPER=1 \
    RUST_LOG=info
# The SQLite database, the generated JWT secret (when none is configured), users' homes and
# workspaces. With Postgres and a configured secret it holds only homes and workspaces.
VOLUME ["/var/lib/acp-gateway/data"]
EXPOSE 8080
# /readyz: the database answers, the default agent starts, not draining. The first check may
# start the default agent, hence the start period.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/acp-gateway-healthcheck"]
# SIGTERM drains: 503 on /readyz, prompts in flight run on for drain_grace_secs (then are
# cancelled), 1001 to clients, then agents stopped and the transcript flushed within
# shutdown_grace_secs (10 s each by default). Give `docker run --stop-timeout` (10 s by default)
# and terminationGracePeriodSeconds more than both.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/acp-gateway"]
CMD ["serve"]

# ---- runtime-prebuilt: with a binary from the build context `prebuilt` (linked against the
# glibc of DEBIAN_IMAGE's release or older).
FROM runtime-base AS runtime-prebuilt
COPY --from=prebuilt acp-gateway /usr/local/bin/acp-gateway

# ---- runtime (the default target, last): with the binary compiled above.
FROM runtime-base AS runtime
COPY --from=build /out/acp-gateway /usr/local/bin/acp-gateway
