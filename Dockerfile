# Multi-stage build: compile in the official Rust image, run on slim Debian.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY migrations ./migrations
COPY static ./static
COPY benches ./benches
RUN cargo build --release --locked --bin acp-gateway

FROM debian:bookworm-slim
# tini reaps zombies and forwards SIGTERM; ca-certificates for agents that call out.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --create-home --home-dir /var/lib/acp-gateway acp
COPY --from=build /src/target/release/acp-gateway /usr/local/bin/acp-gateway
COPY static /usr/share/acp-gateway/static
USER acp
WORKDIR /var/lib/acp-gateway
ENV ACP_GATEWAY_LISTEN=0.0.0.0:8080 \
    ACP_GATEWAY_STATIC_DIR=/usr/share/acp-gateway/static \
    ACP_GATEWAY_DATA_DIR=/var/lib/acp-gateway/data \
    DATABASE_URL=sqlite:///var/lib/acp-gateway/data/acp-gateway.db \
    RUST_LOG=info
EXPOSE 8080

ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/acp-gateway"]
CMD ["serve"]
