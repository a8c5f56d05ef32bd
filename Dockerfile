# gregor as a container image, configured the way Kafka images are: KAFKA_* environment
# variables (KAFKA_BROKER_ID, KAFKA_ZOOKEEPER_CONNECT, KAFKA_LISTENERS,
# KAFKA_ADVERTISED_LISTENERS, KAFKA_LOG_DIRS, ...) or a server.properties mounted and passed
# as the argument.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin gregor

FROM debian:bookworm-slim
COPY --from=build /src/target/release/gregor /usr/local/bin/gregor
COPY config/server.properties /etc/gregor/server.properties
# Set KAFKA_ADVERTISED_LISTENERS to the address clients use (as with Kafka images).
ENV KAFKA_LOG_DIRS=/var/lib/gregor \
    KAFKA_LISTENERS=PLAINTEXT://0.0.0.0:9092
VOLUME /var/lib/gregor
EXPOSE 9092
ENTRYPOINT ["/usr/local/bin/gregor"]
CMD ["/etc/gregor/server.properties"]
