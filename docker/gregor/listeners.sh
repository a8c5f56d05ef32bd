# Sourced by the entrypoint and the health check, so both agree on what the broker binds.
# As in the Confluent image, an unset KAFKA_LISTENERS means "every advertised listener, on
# all interfaces": a compose file that sets only KAFKA_ADVERTISED_LISTENERS works unchanged.
gregor_listeners() {
  if [ -n "${KAFKA_LISTENERS:-}" ]; then
    printf '%s\n' "$KAFKA_LISTENERS"
  elif [ -n "${KAFKA_ADVERTISED_LISTENERS:-}" ]; then
    printf '%s\n' "$KAFKA_ADVERTISED_LISTENERS" | sed -E 's#://(\[[^]]*\]|[^:,]*):#://0.0.0.0:#g'
  else
    printf '%s\n' "PLAINTEXT://0.0.0.0:9092"
  fi
}
