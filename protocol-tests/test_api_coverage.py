"""Every API the broker advertises has a wire-level test here, at its lowest and highest
advertised version.  A newly advertised API (or a wider version range) fails this test until
a test for it is added and listed in COVERAGE."""
import importlib
from pathlib import Path

import kproto as kp
import kproto_admin as ka
import kproto_groups as kg
import kproto_share as ks
import kproto_txn as kt

# api key -> (module, test function) that exercise it at the min and max advertised version
COVERAGE = {
    kp.PRODUCE: ("test_apis", "test_api_at_version"),
    kp.FETCH: ("test_apis", "test_api_at_version"),
    kp.LIST_OFFSETS: ("test_apis", "test_api_at_version"),
    kp.METADATA: ("test_apis", "test_api_at_version"),
    kp.API_VERSIONS: ("test_apis", "test_api_at_version"),
    kp.CREATE_TOPICS: ("test_apis", "test_api_at_version"),
    kp.DELETE_TOPICS: ("test_apis", "test_api_at_version"),
    kp.DELETE_RECORDS: ("test_apis", "test_api_at_version"),
    kp.INIT_PRODUCER_ID: ("test_apis", "test_api_at_version"),
    kp.DESCRIBE_CONFIGS: ("test_apis", "test_api_at_version"),
    kp.CREATE_PARTITIONS: ("test_apis", "test_api_at_version"),
    kp.INCREMENTAL_ALTER_CONFIGS: ("test_apis", "test_api_at_version"),
    kp.DESCRIBE_CLUSTER: ("test_apis", "test_api_at_version"),
    kg.FIND_COORDINATOR: ("test_group_apis", "test_find_coordinator_names_this_broker"),
    kg.JOIN_GROUP: ("test_group_apis", "test_consumer_group_life"),
    kg.SYNC_GROUP: ("test_group_apis", "test_consumer_group_life"),
    kg.HEARTBEAT: ("test_group_apis", "test_consumer_group_life"),
    kg.LEAVE_GROUP: ("test_group_apis", "test_consumer_group_life"),
    kg.OFFSET_COMMIT: ("test_group_apis", "test_consumer_group_life"),
    kg.OFFSET_FETCH: ("test_group_apis", "test_consumer_group_life"),
    kg.DESCRIBE_GROUPS: ("test_group_apis", "test_consumer_group_life"),
    kg.LIST_GROUPS: ("test_group_apis", "test_consumer_group_life"),
    kg.DELETE_GROUPS: ("test_group_apis", "test_consumer_group_life"),
    kg.CONSUMER_GROUP_HEARTBEAT: ("test_group_apis", "test_consumer_group_heartbeat_and_describe"),
    kg.CONSUMER_GROUP_DESCRIBE: ("test_group_apis", "test_consumer_group_heartbeat_and_describe"),
    kg.OFFSET_DELETE: ("test_group_apis", "test_consumer_group_life"),
    kg.OFFSET_FOR_LEADER_EPOCH: ("test_group_apis", "test_offset_for_leader_epoch"),
    ka.ALTER_CONFIGS: ("test_admin_apis", "test_alter_configs_replaces_the_override_set"),
    ka.ELECT_LEADERS: ("test_admin_apis", "test_elect_leaders_on_a_single_broker"),
    ka.DESCRIBE_LOG_DIRS: ("test_admin_apis", "test_describe_log_dirs_reports_partition_sizes"),
    ka.ALTER_PARTITION_REASSIGNMENTS: ("test_admin_apis", "test_partition_reassignment_on_a_single_broker"),
    ka.LIST_PARTITION_REASSIGNMENTS: ("test_admin_apis", "test_partition_reassignment_on_a_single_broker"),
    ka.DESCRIBE_CLIENT_QUOTAS: ("test_admin_apis", "test_client_quotas_alter_and_describe"),
    ka.ALTER_CLIENT_QUOTAS: ("test_admin_apis", "test_client_quotas_alter_and_describe"),
    ka.DESCRIBE_PRODUCERS: ("test_admin_apis", "test_describe_producers_of_a_partition"),
    # Also by real clients on brokers with an authorizer: compat/test_acls.py.
    ka.DESCRIBE_ACLS: ("test_admin_apis", "test_acls_created_described_and_deleted_by_filter"),
    ka.CREATE_ACLS: ("test_admin_apis", "test_acls_created_described_and_deleted_by_filter"),
    ka.DELETE_ACLS: ("test_admin_apis", "test_acls_created_described_and_deleted_by_filter"),
    ka.ALTER_REPLICA_LOG_DIRS: ("test_admin_apis", "test_alter_replica_log_dirs_moves_a_partition"),
    ka.DESCRIBE_TOPIC_PARTITIONS: ("test_admin_apis", "test_describe_topic_partitions_pages_with_its_cursor"),
    ka.LIST_CONFIG_RESOURCES: ("test_admin_apis", "test_list_config_resources_lists_client_metrics_subscriptions"),
    kt.ADD_PARTITIONS_TO_TXN: ("test_txn_apis", "test_transaction_by_raw_frames"),
    kt.ADD_OFFSETS_TO_TXN: ("test_txn_apis", "test_transaction_by_raw_frames"),
    kt.END_TXN: ("test_txn_apis", "test_transaction_by_raw_frames"),
    kt.WRITE_TXN_MARKERS: ("test_txn_apis", "test_transaction_by_raw_frames"),
    kt.TXN_OFFSET_COMMIT: ("test_txn_apis", "test_transaction_by_raw_frames"),
    kt.DESCRIBE_TRANSACTIONS: ("test_txn_apis", "test_transaction_by_raw_frames"),
    kt.LIST_TRANSACTIONS: ("test_txn_apis", "test_transaction_by_raw_frames"),
    # Offered only with share groups on (see test_every_share_api_has_a_wire_test).
    ks.SHARE_GROUP_HEARTBEAT: ("test_share_apis", "test_share_group_heartbeat_and_describe"),
    ks.SHARE_GROUP_DESCRIBE: ("test_share_apis", "test_share_group_heartbeat_and_describe"),
    ks.SHARE_FETCH: ("test_share_apis", "test_share_fetch_and_acknowledge"),
    ks.SHARE_ACKNOWLEDGE: ("test_share_apis", "test_share_fetch_and_acknowledge"),
    ks.READ_SHARE_GROUP_STATE: ("test_share_apis", "test_share_coordinator_reads_and_writes_state"),
    ks.WRITE_SHARE_GROUP_STATE: ("test_share_apis", "test_share_coordinator_reads_and_writes_state"),
}

# APIs a plaintext test broker cannot exercise, covered by real clients on secured listeners
# instead: api key -> (compat test file, test function).
SECURED_COVERAGE = {
    17: ("test_security.py", "test_sasl_out_of_order_unknown_mechanism_and_oversized_token"),  # SaslHandshake
    36: ("test_security.py", "test_session_lifetime_and_reauthentication"),  # SaslAuthenticate
    50: ("test_security.py", "test_scram_credentials_in_zookeeper_reach_every_broker"),  # DescribeUserScram...
    51: ("test_security.py", "test_scram_credentials_in_zookeeper_reach_every_broker"),  # AlterUserScram...
}


def encoder_range(api):
    return (kp.ENCODER_RANGES.get(api) or kg.ENCODER_RANGES.get(api) or ka.ENCODER_RANGES.get(api)
            or ks.ENCODER_RANGES.get(api))


def test_every_advertised_api_has_a_wire_test(broker):
    check_coverage(broker)


def test_every_share_api_has_a_wire_test(broker_factory):
    b = broker_factory(overrides={"group.coordinator.rebalance.protocols": "classic,consumer,share"})
    assert all(k in b.api_versions for k in ks.NAMES), b.api_versions
    check_coverage(b)


def check_coverage(broker):
    with kp.Conn(broker.host, broker.port) as c:
        av = c.api_versions(3)
    assert av["error_code"] == 0
    problems = []
    for api, (lo, hi) in sorted(av["api_keys"].items()):
        name = kp.API_NAMES.get(api, f"key {api}")
        if api in SECURED_COVERAGE:
            path, fn = SECURED_COVERAGE[api]
            source = (Path(__file__).resolve().parent.parent / "compat" / path).read_text()
            if f"def {fn}(" not in source:
                problems.append(f"{name}: compat/{path} has no {fn}")
            continue
        if api not in COVERAGE:
            problems.append(f"{name} (key {api}) v{lo}-{hi} is advertised but has no wire-level test")
            continue
        mod, fn = COVERAGE[api]
        test = getattr(importlib.import_module(mod), fn, None)
        if test is None:
            problems.append(f"{name}: {mod}.{fn} does not exist")
        if mod == "test_apis" and api not in importlib.import_module(mod).CHECKS:
            problems.append(f"{name}: no per-API check in test_apis.CHECKS")
        rng = encoder_range(api)
        if rng is None or lo < rng[0] or hi > rng[1]:
            problems.append(f"{name}: advertised v{lo}-{hi}, the test encoders know {rng}")
    assert not problems, "\n".join(problems)
