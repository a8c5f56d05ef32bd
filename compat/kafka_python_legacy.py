"""One produce / group-consume / commit / resume round against a broker, run by whichever
kafka-python is first on PYTHONPATH (compat/test_old_clients.py runs it with kafka-python
1.4.7, which cannot share a venv with the current release).

    python kafka_python_legacy.py BOOTSTRAP TOPIC GROUP N API_VERSION|auto CODEC|none

Prints one JSON object: the client's version, the records read (offset, timestamp, key, value),
the offset committed and the offset a new member of the group sees.
"""
import json
import sys

import kafka
from kafka.structs import TopicPartition


def main():
    bootstrap, topic, group, n, api, codec = sys.argv[1:7]
    n = int(n)
    api_version = None if api == "auto" else tuple(int(x) for x in api.split("."))
    codec = None if codec == "none" else codec
    common = {"bootstrap_servers": bootstrap, "api_version": api_version}

    p = kafka.KafkaProducer(compression_type=codec, acks="all", **common)
    negotiated = p.config["api_version"]
    for i in range(n):
        p.send(topic, key=b"k%d" % i, value=b"v%d" % i, timestamp_ms=1_700_000_000_000 + i)
    p.flush(60)
    p.close()

    c = kafka.KafkaConsumer(topic, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                            consumer_timeout_ms=60_000, **common)
    got = []
    for m in c:
        got.append([m.offset, m.timestamp, m.key.decode(), m.value.decode()])
        if len(got) == n:
            break
    c.commit()
    committed = c.committed(TopicPartition(topic, 0))
    c.close()

    c = kafka.KafkaConsumer(group_id=group, enable_auto_commit=False, **common)
    resumed = c.committed(TopicPartition(topic, 0))
    c.close()
    print(json.dumps({"version": kafka.__version__, "api_version": list(negotiated), "records": got,
                      "committed": committed, "resumed": resumed}))


if __name__ == "__main__":
    main()
