//! Budgets shared by the replicas, with `session_store: {kind: redis}`:
//! each replica publishes what its windows hold per tenant and reads the
//! others', which admission then counts with its own (`Budget::admit`'s
//! `elsewhere`). Driven by the cluster sync (`balance/sync.rs`) at its
//! sessions' pace (250 ms): a tenant can overshoot its limit by what the
//! other replicas admit in that time, and no request waits on Redis.
//!
//! Each replica writes one hash, `<prefix>tenants:<replica>`, field
//! `<dimension index>|<tenant>`, value the window's count, expiring with
//! the replicas' load (`balance/sync.rs` `load_ttl_ms`); the replicas that published lately
//! are a sorted set, `<prefix>tenants-replicas`, by time. A replica that
//! dies stops counting within that bound.

use super::Tenants;
use crate::store::RedisStore;
use std::collections::HashMap;

fn counts_key(prefix: &str, replica: &str) -> String {
    format!("{prefix}tenants:{replica}")
}

fn replicas_key(prefix: &str) -> String {
    format!("{prefix}tenants-replicas")
}

/// One field of a replica's hash: the dimension's index and the tenant.
fn field(dimension: usize, tenant: &str) -> String {
    format!("{dimension}|{tenant}")
}

/// [`field`] read back; `None` for a field that is not one.
fn parse_field(field: &str) -> Option<(usize, &str)> {
    let (index, tenant) = field.split_once('|')?;
    let index: usize = index.parse().ok()?;
    (index < 4 && !tenant.is_empty()).then_some((index, tenant))
}

/// Publishes this replica's counts and sets every tenant's `elsewhere` to
/// the sum of the other live replicas'. With no budget anywhere and nothing
/// published by the others, nothing is sent but the replicas' read.
/// `ttl_ms`: how long a replica's counts stay without a new publish.
pub async fn exchange(redis: &RedisStore, tenants: &Tenants, now_ms: u64, ttl_ms: u64) {
    let prefix = redis.prefix();
    let mine = counts_key(prefix, &redis.replica);
    let replicas = replicas_key(prefix);
    let published = tenants.published(now_ms);
    let mut pipe = redis::pipe();
    // One transaction: a reader never sees the hash between its DEL and
    // its HSET.
    pipe.atomic().cmd("DEL").arg(&mine).ignore();
    if !published.is_empty() {
        let hset = pipe.cmd("HSET").arg(&mine);
        for (tenant, counts) in &published {
            for (i, n) in counts.iter().enumerate().filter(|(_, n)| **n > 0) {
                hset.arg(field(i, tenant)).arg(*n);
            }
        }
        pipe.ignore().cmd("PEXPIRE").arg(&mine).arg(ttl_ms).ignore();
    }
    redis.roll_call(&mut pipe, &replicas, now_ms, ttl_ms, !published.is_empty());
    let Some((roll,)): Option<(Vec<String>,)> = redis.pipeline("tenants_publish", &pipe).await
    else {
        return;
    };
    let others = redis.others(roll);
    let mut sums: HashMap<String, [u64; 4]> = HashMap::new();
    if !others.is_empty() {
        let mut read = redis::pipe();
        for other in &others {
            read.cmd("HGETALL").arg(counts_key(prefix, other));
        }
        let Some(replies): Option<Vec<HashMap<String, u64>>> =
            redis.pipeline("tenants_read", &read).await
        else {
            return;
        };
        for (f, n) in replies.iter().flatten() {
            if let Some((i, tenant)) = parse_field(f) {
                let slot = &mut sums.entry(tenant.to_string()).or_default()[i];
                *slot = slot.saturating_add(*n);
            }
        }
    }
    tenants.set_elsewhere(&sums, now_ms);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_names_its_dimension_and_tenant_and_others_are_refused() {
        assert_eq!(parse_field(&field(3, "team|a")), Some((3, "team|a")));
        for bad in ["4|team", "x|team", "2|", "team"] {
            assert_eq!(parse_field(bad), None, "{bad}");
        }
    }
}
