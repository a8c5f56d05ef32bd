//! Static membership (instance ids) in the consumer protocol.

use super::tests::*;
use super::*;

fn static_join(id: &str, instance: &str) -> HeartbeatRequest {
    HeartbeatRequest { instance_id: Some(instance.into()), ..join(id, &["t"]) }
}

fn static_beat(id: &str, instance: &str, epoch: i32, owned: Option<&Assignment>) -> HeartbeatRequest {
    HeartbeatRequest { instance_id: Some(instance.into()), ..beat(id, epoch, owned) }
}

/// a (instance i1) and b share four partitions, two each, settled.
fn settled_pair(c: &ConsumerGroupCoordinator, store: &Store) -> (Client, Client) {
    let r = c.heartbeat(store, static_join("a", "i1"));
    assert_eq!(r.error_code, 0, "{r:?}");
    let mut a = Client { id: "a".into(), epoch: r.member_epoch, owned: r.assignment.unwrap_or_default() };
    let mut b = Client::join(c, store, "b");
    for _ in 0..2 {
        let r = c.heartbeat(store, static_beat("a", "i1", a.epoch, Some(&a.owned)));
        assert_eq!(r.error_code, 0, "{r:?}");
        a.epoch = r.member_epoch;
        if let Some(x) = r.assignment {
            a.owned = x;
        }
        b.beat(c, store);
    }
    assert_eq!((parts(&a.owned).len(), parts(&b.owned).len()), (2, 2));
    assert_eq!(c.with_group("g", |g| g.state()), Some(ConsumerGroupState::Stable));
    (a, b)
}

#[tokio::test(start_paused = true)]
async fn a_static_member_that_leaves_for_now_keeps_its_partitions_for_its_successor() {
    let c = coordinator(Topics::new(&[("t", 1, 4)]));
    let store = Store::default();
    let (a, mut b) = settled_pair(&c, &store);
    let epoch = c.with_group("g", |g| g.epoch).unwrap();
    let r = c.heartbeat(&store, static_beat("a", "i1", LEAVE_STATIC_EPOCH, None));
    assert_eq!((r.error_code, r.member_epoch), (0, LEAVE_STATIC_EPOCH));
    // Nothing moves: the group epoch stays and b does not get a's partitions.
    b.beat(&c, &store);
    assert_eq!(parts(&b.owned).len(), 2);
    assert_eq!(c.with_group("g", |g| g.epoch), Some(epoch));
    assert_eq!(c.with_group("g", |g| g.state()), Some(ConsumerGroupState::Reconciling));
    // The instance comes back under a new member id: it gets a's partitions at once, at the
    // assignment epoch, and the group epoch still has not moved.
    let r = c.heartbeat(&store, static_join("a2", "i1"));
    assert_eq!(r.error_code, 0, "{r:?}");
    assert_eq!(r.member_epoch, epoch);
    assert_eq!(parts(&r.assignment.unwrap()), parts(&a.owned));
    assert_eq!(c.with_group("g", |g| g.epoch), Some(epoch));
    assert_eq!(
        c.with_group("g", |g| g.members.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["a2".into(), "b".into()])
    );
    assert_eq!(c.with_group("g", |g| g.state()), Some(ConsumerGroupState::Stable));
    assert_eq!(store.left.lock().unwrap().as_slice(), ["a".to_string()]);
    // The old member id is fenced by its successor.
    let r = c.heartbeat(&store, static_beat("a", "i1", a.epoch, Some(&a.owned)));
    assert_eq!(r.error_code, ErrorCode::FencedInstanceId.code());
    // The records say the same on another coordinator.
    let other = coordinator(Topics::new(&[("t", 1, 4)]));
    for (k, v) in store.records.lock().unwrap().iter() {
        other.replay(records::ConsumerRecord::decode(k, v.as_deref()).expect("our own records decode"));
    }
    other.finish_load(&Store::default(), |_| true);
    let view = |c: &ConsumerGroupCoordinator| {
        c.with_group("g", |g| {
            let m: Vec<_> = g
                .members
                .values()
                .map(|m| (m.id.clone(), m.instance_id.clone(), m.epoch, m.assigned.clone()))
                .collect();
            (g.epoch, g.target.clone(), m)
        })
    };
    assert_eq!(view(&other), view(&c));
}

#[tokio::test(start_paused = true)]
async fn instance_id_errors_as_kafka_answers_them() {
    let c = coordinator(Topics::new(&[("t", 1, 4)]));
    let store = Store::default();
    let (a, _b) = settled_pair(&c, &store);
    let code = |r: HeartbeatResult| r.error_code;
    // Another member cannot take i1 while a holds it.
    assert_eq!(code(c.heartbeat(&store, static_join("x", "i1"))), ErrorCode::UnreleasedInstanceId.code());
    // An instance id nobody joined with.
    assert_eq!(code(c.heartbeat(&store, static_beat("a", "i9", a.epoch, None))), ErrorCode::UnknownMemberId.code());
    assert_eq!(
        code(c.heartbeat(&store, static_beat("a", "i9", LEAVE_STATIC_EPOCH, None))),
        ErrorCode::UnknownMemberId.code()
    );
    // i1 under another member id.
    assert_eq!(
        code(c.heartbeat(&store, static_beat("b", "i1", LEAVE_STATIC_EPOCH, None))),
        ErrorCode::FencedInstanceId.code()
    );
    assert_eq!(c.with_group("g", |g| g.members.len()), Some(2));
    assert_eq!(c.with_group("g", |g| g.members.get("a").map(|m| m.epoch)), Some(Some(a.epoch)));
    // A static member leaving with -1 leaves for good.
    assert_eq!(code(c.heartbeat(&store, static_beat("a", "i1", -1, None))), 0);
    assert_eq!(c.with_group("g", |g| g.static_member("i1").is_none()), Some(true));
}

#[tokio::test(start_paused = true)]
async fn a_static_member_that_does_not_come_back_loses_its_partitions_at_the_session_timeout() {
    let c = coordinator(Topics::new(&[("t", 1, 4)]));
    let store = Store::default();
    let (_a, mut b) = settled_pair(&c, &store);
    assert_eq!(c.heartbeat(&store, static_beat("a", "i1", LEAVE_STATIC_EPOCH, None)).error_code, 0);
    for _ in 0..9 {
        tokio::time::advance(Duration::from_secs(5)).await;
        b.beat(&c, &store);
        c.tick(&store);
        assert_eq!(parts(&b.owned).len(), 2, "a's partitions wait for it");
    }
    tokio::time::advance(Duration::from_secs(2)).await;
    c.tick(&store);
    assert_eq!(c.with_group("g", |g| g.members.contains_key("a")), Some(false));
    b.beat(&c, &store);
    assert_eq!(parts(&b.owned).len(), 4);
    // Now the instance id is free: a newcomer with it is a new member and starts from nothing.
    let r = c.heartbeat(&store, static_join("a3", "i1"));
    assert_eq!(r.error_code, 0);
    assert!(parts(&r.assignment.unwrap()).is_empty(), "b must revoke first");
}
