# gregor as a container image, configured the way Kafka images are: KAFKA_* environment
# variables (KAFKA_BROKER_ID, KAFKA_ZOOKEEPER_CONNECT, KAFKA_ADVERTISED_LISTENERS,
# KAFKA_LISTENER_SECURITY_PROTOCOL_MAP, ...) map to server.properties keys, as in the
# Confluent and Bitnami images.
#
# Anywhere with a registry:   docker build -t gregor .
# Offline (no registry), from a Debian root filesystem and a binary built on the host:
#                             scripts/images   (see the README)
#
# BASE is the runtime image. BUILDER is the image the binary is compiled in; with
# PREBUILT=1 nothing is compiled and target/docker/gregor from the build context is used
# instead, so BUILDER can be BASE itself (the classic builder builds every stage it sees,
# so the choice is made inside the stage rather than by picking a stage).
ARG BASE=debian:bookworm-slim
ARG BUILDER=rust:1-slim-bookworm

FROM ${BUILDER} AS build
ARG PREBUILT=
WORKDIR /src
COPY . .
RUN if [ -n "$PREBUILT" ]; then \
      install -D -m 0755 target/docker/gregor /out/gregor; \
    else \
      cargo build --release --locked --bin gregor && install -D -m 0755 target/release/gregor /out/gregor; \
    fi

FROM ${BASE}
# uid 1000 and the data directory of the Confluent image, so volumes and compose files
# written for it keep working.
RUN groupadd --gid 1000 appuser \
 && useradd --uid 1000 --gid appuser --home-dir /var/lib/kafka --no-create-home --shell /usr/sbin/nologin appuser \
 && mkdir -p /var/lib/kafka/data \
 && chown -R appuser:appuser /var/lib/kafka
COPY --from=build /out/gregor /usr/local/bin/gregor
COPY docker/gregor/entrypoint docker/gregor/healthcheck docker/gregor/listeners.sh /usr/local/lib/gregor/
ENV KAFKA_LOG_DIRS=/var/lib/kafka/data
VOLUME /var/lib/kafka/data
EXPOSE 9092
USER appuser
HEALTHCHECK --interval=5s --timeout=4s --start-period=60s --retries=3 CMD ["/usr/local/lib/gregor/healthcheck"]
ENTRYPOINT ["/usr/local/lib/gregor/entrypoint"]
