# Multi-stage build: compile with the full toolchain, run on a slim image
# with only libpq and CA certificates.
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libpq-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, in a layer of their own: build them against empty
# stand-ins for the project's sources, so that this layer is reused from
# Docker's cache until Cargo.toml or Cargo.lock change, and a source change
# rebuilds only the project itself (seconds, not minutes).
# The workspace also names the tools' package (tools/) and the load
# generators' (bench/): cargo reads their manifests, but the image never
# builds them.
COPY Cargo.toml Cargo.lock ./
COPY tools/Cargo.toml ./tools/
COPY bench/Cargo.toml ./bench/
# (Every target the manifests name needs a stand-in for cargo to read them.)
RUN mkdir -p src tools/src bench/src \
    && for target in src/main.rs tools/src/main.rs bench/src/main.rs; do \
         echo 'fn main() {}' > "$target"; \
       done \
    && touch src/lib.rs tools/src/lib.rs bench/src/lib.rs \
    && cargo build --release --locked --bin token-billing \
    && rm -rf src
# The project. `touch` makes its files newer than the stand-ins', so cargo
# rebuilds them whatever times the build context carries.
COPY build.rs diesel.toml ./
COPY migrations ./migrations
COPY src ./src
COPY static ./static
RUN find src -name '*.rs' -exec touch {} + \
    && cargo build --release --locked --bin token-billing

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libpq5 ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 token-billing
COPY --from=build /src/target/release/token-billing /usr/local/bin/token-billing
USER token-billing
ENV BIND_ADDR=0.0.0.0:8080
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD curl -fsS http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["token-billing"]
CMD ["serve"]
