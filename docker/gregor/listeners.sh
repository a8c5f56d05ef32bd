# Sourced by the entrypoint and the health check, so both agree on what the broker binds.
# As in the Confluent image, an unset KAFKA_LISTENERS means "every advertised listener, on
# all interfaces": a compose file that sets only KAFKA_ADVERTISED_LISTENERS works unchanged.
# Bitnami's spellings (KAFKA_CFG_*) count as well.
gregor_listeners() {
  local bind="${KAFKA_LISTENERS:-${KAFKA_CFG_LISTENERS:-}}"
  local advertised="${KAFKA_ADVERTISED_LISTENERS:-${KAFKA_CFG_ADVERTISED_LISTENERS:-}}"
  if [ -n "$bind" ]; then
    printf '%s\n' "$bind"
  elif [ -n "$advertised" ]; then
    printf '%s\n' "$advertised" | sed -E 's#://(\[[^]]*\]|[^:,]*):#://0.0.0.0:#g'
  else
    printf '%s\n' "PLAINTEXT://0.0.0.0:9092"
  fi
}
