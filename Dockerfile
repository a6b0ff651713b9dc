FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY model ./model
COPY migrations ./migrations
COPY cypher ./cypher
COPY benches ./benches
RUN cargo build --release --locked --bin mnemosyne

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* && useradd --system --uid 10001 mnemosyne
COPY --from=build /src/target/release/mnemosyne /usr/local/bin/mnemosyne
USER mnemosyne
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/mnemosyne"]
CMD ["serve"]
