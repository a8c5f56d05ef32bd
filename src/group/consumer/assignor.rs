//! The server-side assignors of the consumer protocol (KIP-848): `uniform`, Kafka's default,
//! which balances every member's partition count and keeps partitions where they are when it
//! can, and `range`, which gives each member a contiguous range of every topic it subscribes
//! to. Both are pure functions of the members' subscriptions, the topics' partition counts and
//! (for `uniform`) the previous target assignment, so the coordinator can run them under its
//! lock and tests can run them alone.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use uuid::Uuid;

/// Partitions by topic id, as the protocol and the records carry them.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// One member as an assignor sees it.
pub struct MemberSpec<'a> {
    pub id: &'a str,
    /// Ids of the subscribed topics that exist.
    pub subscribed: BTreeSet<Uuid>,
    /// Its partitions in the previous target assignment.
    pub previous: Option<&'a Assignment>,
}

pub const UNIFORM: &str = "uniform";
pub const RANGE: &str = "range";

/// Runs the assignor `name` (anything but `range` is `uniform`: the coordinator refuses names
/// it does not know before it gets here). Every member gets an entry, empty if nothing is its.
pub fn assign(name: &str, members: &[MemberSpec<'_>], topics: &BTreeMap<Uuid, i32>) -> BTreeMap<String, Assignment> {
    match name {
        RANGE => range(members, topics),
        _ => uniform(members, topics),
    }
}

fn to_assignment(parts: &BTreeSet<(Uuid, i32)>) -> Assignment {
    let mut a = Assignment::new();
    for (t, p) in parts {
        a.entry(*t).or_default().insert(*p);
    }
    a
}

/// Each member subscribed to a topic gets `count / n` of its partitions in order of member id,
/// the first `count % n` one more.
fn range(members: &[MemberSpec<'_>], topics: &BTreeMap<Uuid, i32>) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members.iter().map(|m| (m.id.to_string(), Assignment::new())).collect();
    for (&topic, &count) in topics {
        let mut subscribers: Vec<&str> =
            members.iter().filter(|m| m.subscribed.contains(&topic)).map(|m| m.id).collect();
        if subscribers.is_empty() || count <= 0 {
            continue;
        }
        subscribers.sort_unstable();
        let n = subscribers.len() as i32;
        let (each, extra) = (count / n, count % n);
        let mut next = 0;
        for (i, id) in subscribers.iter().enumerate() {
            let take = each + i32::from((i as i32) < extra);
            if take > 0 {
                let parts = out.entry(id.to_string()).or_default().entry(topic).or_default();
                parts.extend(next..next + take);
            }
            next += take;
        }
    }
    out
}

/// Sticky and balanced. When every member subscribes to the same topics each ends with
/// `P / M` or one more partitions and keeps as many of its previous ones as that allows.
/// Otherwise partitions go to the least loaded member that may have them, then a bounded pass
/// moves partitions from the most to the least loaded member while that narrows the gap.
fn uniform(members: &[MemberSpec<'_>], topics: &BTreeMap<Uuid, i32>) -> BTreeMap<String, Assignment> {
    let mut owned: Vec<BTreeSet<(Uuid, i32)>> = vec![BTreeSet::new(); members.len()];
    if members.is_empty() {
        return BTreeMap::new();
    }
    let mut taken: HashSet<(Uuid, i32)> = HashSet::new();
    for (i, m) in members.iter().enumerate() {
        for (t, ps) in m.previous.into_iter().flatten() {
            let Some(&count) = topics.get(t).filter(|_| m.subscribed.contains(t)) else { continue };
            for &p in ps.iter().filter(|&&p| p >= 0 && p < count) {
                if taken.insert((*t, p)) {
                    owned[i].insert((*t, p));
                }
            }
        }
    }
    let homogeneous = members.windows(2).all(|w| w[0].subscribed == w[1].subscribed);
    let all: Vec<(Uuid, i32)> = topics
        .iter()
        .filter(|(t, _)| members.iter().any(|m| m.subscribed.contains(t)))
        .flat_map(|(t, &count)| (0..count.max(0)).map(move |p| (*t, p)))
        .collect();
    if homogeneous {
        let total = all.len();
        let (base, mut extras) = (total / members.len(), total % members.len());
        // Members keeping the most claim the extra slots first, so fewer partitions move.
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(owned[i].len()));
        let mut quota = vec![base; members.len()];
        for &i in &order {
            if owned[i].len() > base && extras > 0 {
                quota[i] = base + 1;
                extras -= 1;
            }
            while owned[i].len() > quota[i] {
                let Some(last) = owned[i].iter().next_back().copied() else { break };
                owned[i].remove(&last);
                taken.remove(&last);
            }
        }
        for tp in all.iter().filter(|tp| !taken.contains(tp)) {
            // The least loaded member with room; one at the base takes an extra slot.
            let pick = (0..members.len())
                .filter(|&i| owned[i].len() < quota[i] || (owned[i].len() == base && extras > 0))
                .min_by_key(|&i| owned[i].len());
            let Some(i) = pick else { break };
            if owned[i].len() == quota[i] {
                quota[i] += 1;
                extras -= 1;
            }
            owned[i].insert(*tp);
        }
    } else {
        for tp in all.iter().filter(|tp| !taken.contains(tp)) {
            let pick =
                (0..members.len()).filter(|&i| members[i].subscribed.contains(&tp.0)).min_by_key(|&i| owned[i].len());
            if let Some(i) = pick {
                owned[i].insert(*tp);
            }
        }
        // Each move lowers the sum of squared counts, so this ends; the bound keeps a
        // pathological subscription mix from taking long under the coordinator's lock.
        for _ in 0..all.len() {
            let mut moved = false;
            let mut donors: Vec<usize> = (0..members.len()).collect();
            donors.sort_by_key(|&i| std::cmp::Reverse(owned[i].len()));
            'donors: for &d in &donors {
                for tp in owned[d].iter().rev() {
                    let to = (0..members.len())
                        .filter(|&r| members[r].subscribed.contains(&tp.0) && owned[r].len() + 2 <= owned[d].len())
                        .min_by_key(|&r| owned[r].len());
                    if let Some(r) = to {
                        let tp = *tp;
                        owned[d].remove(&tp);
                        owned[r].insert(tp);
                        moved = true;
                        break 'donors;
                    }
                }
            }
            if !moved {
                break;
            }
        }
    }
    members.iter().zip(owned.iter()).map(|(m, parts)| (m.id.to_string(), to_assignment(parts))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(n: u8) -> Uuid {
        Uuid::from_bytes([n; 16])
    }

    fn spec<'a>(id: &'a str, topics: &[Uuid], previous: Option<&'a Assignment>) -> MemberSpec<'a> {
        MemberSpec { id, subscribed: topics.iter().copied().collect(), previous }
    }

    fn count(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    fn every_partition_once(out: &BTreeMap<String, Assignment>, topics: &BTreeMap<Uuid, i32>) {
        let mut seen = HashSet::new();
        for a in out.values() {
            for (t, ps) in a {
                for p in ps {
                    assert!(seen.insert((*t, *p)), "{t} {p} assigned twice");
                }
            }
        }
        let total: i32 = topics.values().sum();
        assert_eq!(seen.len(), total as usize);
    }

    #[test]
    fn uniform_splits_evenly_and_keeps_what_it_can() {
        let t = topic(1);
        let topics = BTreeMap::from([(t, 6)]);
        let two = assign(UNIFORM, &[spec("a", &[t], None), spec("b", &[t], None)], &topics);
        every_partition_once(&two, &topics);
        assert_eq!((count(&two["a"]), count(&two["b"])), (3, 3));
        // A third member joins: each keeps two of its three, the newcomer gets the rest.
        let three = assign(
            UNIFORM,
            &[spec("a", &[t], Some(&two["a"])), spec("b", &[t], Some(&two["b"])), spec("c", &[t], None)],
            &topics,
        );
        every_partition_once(&three, &topics);
        for m in ["a", "b"] {
            assert_eq!(count(&three[m]), 2);
            assert!(three[m][&t].is_subset(&two[m][&t]), "{m} lost a partition it could keep");
        }
        assert_eq!(count(&three["c"]), 2);
        // One leaves: the other two absorb its partitions without giving any up.
        let back = assign(UNIFORM, &[spec("a", &[t], Some(&three["a"])), spec("c", &[t], Some(&three["c"]))], &topics);
        every_partition_once(&back, &topics);
        assert!(three["a"][&t].is_subset(&back["a"][&t]));
        assert!(three["c"][&t].is_subset(&back["c"][&t]));
    }

    #[test]
    fn uniform_with_uneven_counts_and_mixed_subscriptions() {
        let (t1, t2) = (topic(1), topic(2));
        let topics = BTreeMap::from([(t1, 7), (t2, 3)]);
        let out = assign(
            UNIFORM,
            &[spec("a", &[t1, t2], None), spec("b", &[t1, t2], None), spec("c", &[t1, t2], None)],
            &topics,
        );
        every_partition_once(&out, &topics);
        let mut counts: Vec<usize> = out.values().map(count).collect();
        counts.sort();
        assert_eq!(counts, vec![3, 3, 4]);
        let mixed = assign(UNIFORM, &[spec("a", &[t1], None), spec("b", &[t1, t2], None)], &topics);
        every_partition_once(&mixed, &topics);
        assert!(!mixed["a"].contains_key(&t2), "a is not subscribed to t2");
        assert!((count(&mixed["a"]) as i64 - count(&mixed["b"]) as i64).abs() <= 1);
    }

    #[test]
    fn range_gives_contiguous_ranges_by_member_id() {
        let t = topic(1);
        let topics = BTreeMap::from([(t, 7)]);
        let out = assign(RANGE, &[spec("b", &[t], None), spec("a", &[t], None), spec("c", &[t], None)], &topics);
        every_partition_once(&out, &topics);
        assert_eq!(out["a"][&t], BTreeSet::from([0, 1, 2]));
        assert_eq!(out["b"][&t], BTreeSet::from([3, 4]));
        assert_eq!(out["c"][&t], BTreeSet::from([5, 6]));
    }

    #[test]
    fn partitions_of_a_topic_nobody_subscribes_to_stay_unassigned() {
        let (t1, t2) = (topic(1), topic(2));
        let topics = BTreeMap::from([(t1, 2), (t2, 2)]);
        for name in [UNIFORM, RANGE] {
            let out = assign(name, &[spec("a", &[t1], None)], &topics);
            assert_eq!(count(&out["a"]), 2, "{name}");
            assert!(!out["a"].contains_key(&t2), "{name}");
        }
    }
}
