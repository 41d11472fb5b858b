//! The session store shared by gateway replicas. With
//! `session_store: {kind: redis}` every replica reads and writes session
//! bindings in Redis, so a conversation's turns reach one engine whichever
//! replica takes them; each replica also publishes its in-flight per peer
//! so placement compares the whole cluster's load. The local session table
//! stays the working copy and the fallback: Redis slower than `timeout`, or
//! down, never fails or delays a request past that bound.
//!
//! What is agreed, and how (`balance/shared.rs` drives it):
//! - a first placement is a `SET NX`: the replica that loses the race takes
//!   the winner's peer;
//! - a move (spill, migration) is a compare-and-set script on the peer the
//!   session was on, so two replicas cannot move one session two ways;
//! - a replica trusts its local copy of a binding for `SYNC_MS` after it
//!   last read or wrote it: a move made elsewhere is seen within that bound;
//! - bindings expire with the route's `idle_timeout`, refreshed at most every
//!   `idle_timeout / 8` per session, not on every request.
//!
//! Beside the bindings: where each conversation recognised by content goes
//! on (`content_put`, `content_get`: `proxy/request/session.rs`) and which
//! session each Responses API answer belongs to (`response_put`:
//! `proxy/response/record.rs`; `response_get`). This module owns the
//! connections and every command, each bounded by the store's timeout;
//! `binding.rs` the keys and values (pure); it knows nothing of routes but
//! their names. The background task that drives it is `balance/sync.rs`.

pub mod binding;

use crate::config::store::{RedisStoreConfig, SessionStoreConfig};
use crate::metrics::metrics;
use arc_swap::ArcSwapOption;
use binding::{binding_key, Claim, StoredBinding};
use parking_lot::Mutex;
use redis::aio::ConnectionManager;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a replica trusts its local copy of a binding it read or wrote.
pub const SYNC_MS: u64 = 1_000;
/// Sessions placed while Redis was away, written back when it returns; past
/// this many the oldest are not (they re-converge on their next turn).
const MAX_DIRTY: usize = 100_000;

/// Moves a binding only if it is still on the peer the mover saw: KEYS[1]
/// the binding, ARGV[1] the expected peer, ARGV[2] the new value, ARGV[3]
/// the TTL in ms. Returns {1, new} when it moved, {0, current} when another
/// replica's binding stands.
const CAS_SCRIPT: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then
  local peer = string.match(cur, '^v1|([^|]*)|')
  if peer ~= ARGV[1] then return {0, cur} end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return {1, ARGV[2]}
";

/// A binding, or when none stands, the route's first placements claimed
/// since a time: KEYS[1] the binding, KEYS[2] the claims; ARGV[1] the time.
/// Returns {binding} or {"", claim…}: a warm turn's one `GET` and a first
/// turn's view of the others' claims in one round trip.
const GET_OR_CLAIMS_SCRIPT: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then return {cur} end
local claims = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], '+inf')
table.insert(claims, 1, '')
return claims
";

/// A first placement claimed: the binding set if absent and, when it was,
/// the claim added to the route's claims, those older than the keep dropped.
/// KEYS[1] the binding, KEYS[2] the claims; ARGV[1] the binding's value,
/// ARGV[2] its TTL in ms, ARGV[3] now (ms), ARGV[4] the claim, ARGV[5] how
/// long claims are kept (ms). Returns the binding that stood, or nil.
const CLAIM_SCRIPT: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then return cur end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (tonumber(ARGV[3]) - tonumber(ARGV[5])))
redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[5]))
return false
";

/// The process's session store: local only, or Redis.
pub struct SessionStore {
    redis: Option<RedisStore>,
}

impl SessionStore {
    pub fn new(cfg: &SessionStoreConfig) -> Result<Self, String> {
        let redis = match cfg {
            SessionStoreConfig::Local => None,
            SessionStoreConfig::Redis(r) => Some(RedisStore::new(r)?),
        };
        Ok(SessionStore { redis })
    }

    pub fn local() -> Self {
        SessionStore { redis: None }
    }

    pub fn redis(&self) -> Option<&RedisStore> {
        self.redis.as_ref()
    }

    pub fn kind(&self) -> &'static str {
        match self.redis {
            Some(_) => "redis",
            None => "local",
        }
    }
}

/// Redis as the shared store: connections, the per-session sync times, the
/// sessions placed while it was away.
pub struct RedisStore {
    cfg: RedisStoreConfig,
    client: redis::Client,
    /// This process, in the load keys; random per start.
    pub replica: String,
    conns: ArcSwapOption<Vec<ConnectionManager>>,
    next_conn: AtomicUsize,
    up: AtomicBool,
    /// Commands sent, for the bench's operations per request.
    ops: AtomicU64,
    /// (route, session) → when this replica last agreed with Redis on it,
    /// and when it last refreshed the key's TTL.
    synced: Mutex<HashMap<(Arc<str>, u64), Synced>>,
    dirty: Mutex<Vec<(Arc<str>, u64)>>,
    cas: redis::Script,
    get_or_claims: redis::Script,
    claim: redis::Script,
}

#[derive(Debug, Clone, Copy)]
struct Synced {
    at_ms: u64,
    ttl_refreshed_ms: u64,
}

/// What a compare-and-set found.
pub enum Cas {
    Moved,
    /// Another replica's binding stands (`None`: it could not be read).
    Kept(Option<StoredBinding>),
}

impl RedisStore {
    fn new(cfg: &RedisStoreConfig) -> Result<Self, String> {
        let mut info: redis::ConnectionInfo = cfg
            .url
            .as_str()
            .parse()
            .map_err(|e: redis::RedisError| format!("session_store.url: {:?}", e.kind()))?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &cfg.username {
            settings = settings.set_username(user.clone());
        }
        if let Some(path) = &cfg.password_file {
            let password = std::fs::read_to_string(path)
                .map_err(|e| format!("session_store.password_file {}: {e}", path.display()))?;
            settings = settings.set_password(password.lines().next().unwrap_or(""));
        }
        info = info.set_redis_settings(settings);
        let client = redis::Client::open(info).map_err(|e| format!("{:?}", e.kind()))?;
        Ok(RedisStore {
            cfg: cfg.clone(),
            client,
            replica: format!("{:016x}", rand_u64()),
            conns: ArcSwapOption::empty(),
            next_conn: AtomicUsize::new(0),
            up: AtomicBool::new(false),
            ops: AtomicU64::new(0),
            synced: Mutex::new(HashMap::new()),
            dirty: Mutex::new(Vec::new()),
            cas: redis::Script::new(CAS_SCRIPT),
            get_or_claims: redis::Script::new(GET_OR_CLAIMS_SCRIPT),
            claim: redis::Script::new(CLAIM_SCRIPT),
        })
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    pub fn prefix(&self) -> &str {
        &self.cfg.key_prefix
    }

    pub fn timeout(&self) -> Duration {
        self.cfg.timeout
    }

    pub fn sync_interval(&self) -> Duration {
        self.cfg.sync_interval
    }

    /// How long a first placement's claim is read back by the others: until
    /// two syncs have carried it (this replica's publish, their read), with
    /// 100 ms for the replicas' clocks, which time the claims.
    pub fn claims_kept_ms(&self) -> Option<u64> {
        let sync = u64::try_from(self.cfg.sync_interval.as_millis()).unwrap_or(u64::MAX);
        self.cfg
            .share_claims
            .then(|| sync.saturating_mul(2).saturating_add(100))
    }

    /// Opens the connections if there are none yet (the connection manager
    /// reconnects by itself after that). Called by the store's task.
    pub async fn ensure_connected(&self) {
        if self.conns.load().is_some() {
            return;
        }
        let mut conns = Vec::with_capacity(self.cfg.pool_size);
        for _ in 0..self.cfg.pool_size {
            let open = self.client.get_connection_manager();
            match tokio::time::timeout(Duration::from_secs(1), open).await {
                Ok(Ok(conn)) => conns.push(conn),
                Ok(Err(e)) => {
                    self.failed("connect", &format!("{:?}", e.kind()));
                    return;
                }
                Err(_) => {
                    self.failed("connect", "timeout");
                    return;
                }
            }
        }
        log::info!(
            "session store: connected to Redis ({} connection(s))",
            conns.len()
        );
        self.conns.store(Some(Arc::new(conns)));
    }

    fn conn(&self) -> Option<ConnectionManager> {
        let conns = self.conns.load_full()?;
        let i = self.next_conn.fetch_add(1, Ordering::Relaxed) % conns.len().max(1);
        conns.get(i).cloned()
    }

    /// Runs one Redis call on a connection within the timeout; `None` on
    /// any failure (counted per `op`, and the store marked down).
    async fn bounded<T, F, Fut>(&self, op: &'static str, call: F) -> Option<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let Some(conn) = self.conn() else {
            self.failed(op, "not connected");
            return None;
        };
        self.count(op);
        match tokio::time::timeout(self.cfg.timeout, call(conn)).await {
            Ok(Ok(v)) => {
                self.succeeded();
                Some(v)
            }
            Ok(Err(e)) => {
                self.failed(op, &format!("{:?}", e.kind()));
                None
            }
            Err(_) => {
                self.failed(op, "timeout");
                None
            }
        }
    }

    /// One command, bounded as [`bounded`](Self::bounded).
    pub async fn query<T: redis::FromRedisValue>(
        &self,
        op: &'static str,
        cmd: &redis::Cmd,
    ) -> Option<T> {
        self.bounded(op, |mut conn| async move {
            cmd.query_async::<T>(&mut conn).await
        })
        .await
    }

    fn count(&self, op: &'static str) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        metrics().session_store_ops.with_label_values(&[op]).inc();
    }

    fn succeeded(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            log::info!("session store: Redis is up");
        }
        metrics().session_store_up.set(1);
    }

    fn failed(&self, op: &'static str, why: &str) {
        metrics()
            .session_store_errors
            .with_label_values(&[op])
            .inc();
        if self.up.swap(false, Ordering::Relaxed) {
            log::warn!("session store: Redis {op} failed ({why}); placing from the local table until it is back");
        }
        metrics().session_store_up.set(0);
    }

    /// Appends to `pipe` the replicas' roll call in the sorted set
    /// `replicas`: this replica marked live at `now` (with `present`), the
    /// ones unseen for `ttl_ms` dropped, the set kept four of those, and
    /// the live ones read, as the pipeline's last reply (see
    /// [`others`](Self::others)).
    pub fn roll_call(
        &self,
        pipe: &mut redis::Pipeline,
        replicas: &str,
        now: u64,
        ttl_ms: u64,
        present: bool,
    ) {
        if present {
            pipe.cmd("ZADD")
                .arg(replicas)
                .arg(now)
                .arg(&self.replica)
                .ignore();
        }
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(replicas)
            .arg("-inf")
            .arg(now.saturating_sub(ttl_ms))
            .ignore()
            .cmd("PEXPIRE")
            .arg(replicas)
            .arg(ttl_ms * 4)
            .ignore()
            .cmd("ZRANGE")
            .arg(replicas)
            .arg(0)
            .arg(-1);
    }

    /// The live replicas a [`roll_call`](Self::roll_call) read, this one
    /// left out.
    pub fn others(&self, live: Vec<String>) -> Vec<String> {
        live.into_iter().filter(|r| *r != self.replica).collect()
    }

    /// A pipeline, bounded as [`bounded`](Self::bounded).
    pub async fn pipeline<T: redis::FromRedisValue>(
        &self,
        op: &'static str,
        pipe: &redis::Pipeline,
    ) -> Option<T> {
        self.bounded(op, |mut conn| async move {
            pipe.query_async::<T>(&mut conn).await
        })
        .await
    }

    /// The binding Redis holds for `sid` on `route`. `Err(())`: Redis could
    /// not answer in time.
    pub async fn get(&self, route: &str, sid: u64) -> Result<Option<StoredBinding>, ()> {
        let key = binding_key(&self.cfg.key_prefix, route, sid);
        let value: Option<String> = self
            .query("get", redis::cmd("GET").arg(&key))
            .await
            .ok_or(())?;
        Ok(value.as_deref().and_then(StoredBinding::decode))
    }

    /// [`get`](Self::get), and when no binding stands, the first placements
    /// the replicas claimed on `route` since `since_ms` (the script costs no
    /// round trip more than the `GET`).
    pub async fn get_or_claims(
        &self,
        route: &str,
        sid: u64,
        since_ms: u64,
    ) -> Result<(Option<StoredBinding>, Vec<Claim>), ()> {
        let key = binding_key(&self.cfg.key_prefix, route, sid);
        let mut invocation = self.get_or_claims.key(&key);
        invocation
            .key(binding::claims_key(&self.cfg.key_prefix, route))
            .arg(since_ms);
        let reply: Vec<String> = self
            .bounded("get", |mut conn| async move {
                invocation.invoke_async::<Vec<String>>(&mut conn).await
            })
            .await
            .ok_or(())?;
        let mut reply = reply.into_iter();
        match reply.next().filter(|b| !b.is_empty()) {
            Some(b) => Ok((StoredBinding::decode(&b), Vec::new())),
            None => Ok((None, reply.filter_map(|c| Claim::decode(&c)).collect())),
        }
    }

    /// [`set_if_absent`](Self::set_if_absent), and when it wrote, `claim`
    /// added at `now_ms` to the route's claims (kept
    /// [`claims_kept_ms`](Self::claims_kept_ms)).
    pub async fn claim(
        &self,
        route: &str,
        sid: u64,
        b: &StoredBinding,
        ttl: Duration,
        claim: &Claim,
        now_ms: u64,
    ) -> Result<Option<StoredBinding>, ()> {
        let keep_ms = self.claims_kept_ms().unwrap_or(1);
        let key = binding_key(&self.cfg.key_prefix, route, sid);
        let mut invocation = self.claim.key(&key);
        invocation
            .key(binding::claims_key(&self.cfg.key_prefix, route))
            .arg(b.encode())
            .arg(ttl_ms(ttl))
            .arg(now_ms)
            .arg(claim.encode(sid))
            .arg(keep_ms);
        let previous: Option<String> = self
            .bounded("set_nx", |mut conn| async move {
                invocation.invoke_async::<Option<String>>(&mut conn).await
            })
            .await
            .ok_or(())?;
        Ok(previous.as_deref().and_then(StoredBinding::decode))
    }

    /// Writes `b` unless a binding exists. `Ok(None)`: written; `Ok(Some)`:
    /// the binding that won.
    pub async fn set_if_absent(
        &self,
        route: &str,
        sid: u64,
        b: &StoredBinding,
        ttl: Duration,
    ) -> Result<Option<StoredBinding>, ()> {
        let key = binding_key(&self.cfg.key_prefix, route, sid);
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key)
            .arg(b.encode())
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms(ttl))
            .arg("GET");
        // `SET … NX GET` answers the value that was there (nil: we wrote).
        let previous: Option<String> = self.query("set_nx", &cmd).await.ok_or(())?;
        Ok(previous.as_deref().and_then(StoredBinding::decode))
    }

    /// Moves `sid` from `expected_peer` to `b.peer`, unless another replica
    /// moved it first.
    pub async fn compare_and_set(
        &self,
        route: &str,
        sid: u64,
        expected_peer: &str,
        b: &StoredBinding,
        ttl: Duration,
    ) -> Result<Cas, ()> {
        let key = binding_key(&self.cfg.key_prefix, route, sid);
        let mut invocation = self.cas.key(&key);
        invocation
            .arg(expected_peer)
            .arg(b.encode())
            .arg(ttl_ms(ttl));
        let reply = self
            .bounded("cas", |mut conn| async move {
                invocation.invoke_async::<(i64, String)>(&mut conn).await
            })
            .await;
        match reply {
            Some((1, _)) => Ok(Cas::Moved),
            Some((_, current)) => Ok(Cas::Kept(StoredBinding::decode(&current))),
            None => Err(()),
        }
    }

    /// Which of `nodes` (keyed content-index nodes) Redis knows, and as
    /// what: the session, the depth, whether a stem. `None`: no answer
    /// in time.
    pub async fn content_get(
        &self,
        route: &str,
        nodes: &[(u64, usize)],
    ) -> Option<Vec<Option<(u64, usize, bool)>>> {
        let mut cmd = redis::cmd("MGET");
        for (node, _) in nodes {
            cmd.arg(binding::content_key(&self.cfg.key_prefix, route, *node));
        }
        let values: Vec<Option<String>> = self.query("content_get", &cmd).await?;
        Some(
            values
                .iter()
                .map(|v| v.as_deref().and_then(binding::decode_content))
                .collect(),
        )
    }

    /// Writes where a request's conversation goes on (its tip, and its
    /// stem if any), for the other replicas, expiring with `ttl`.
    pub async fn content_put(&self, route: &str, nodes: &[(u64, u64, usize, bool)], ttl: Duration) {
        let mut pipe = redis::pipe();
        for &(node, session, depth, stem) in nodes {
            pipe.cmd("SET")
                .arg(binding::content_key(&self.cfg.key_prefix, route, node))
                .arg(binding::encode_content(session, depth, stem))
                .arg("PX")
                .arg(ttl_ms(ttl))
                .ignore();
        }
        let _: Option<()> = self.pipeline("content_put", &pipe).await;
    }

    /// The session the response (its id's hash) answered, as another
    /// replica wrote it. `None`: no answer in time.
    pub async fn response_get(&self, route: &str, response: u64) -> Option<Option<u64>> {
        let key = binding::response_key(&self.cfg.key_prefix, route, response);
        let value: Option<String> = self
            .query("response_get", redis::cmd("GET").arg(&key))
            .await?;
        Some(value.and_then(|v| u64::from_str_radix(&v, 16).ok()))
    }

    /// Response `response` answered a turn of `session`, for the replica
    /// the next turn reaches.
    pub async fn response_put(&self, route: &str, response: u64, session: u64, ttl: Duration) {
        let key = binding::response_key(&self.cfg.key_prefix, route, response);
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key)
            .arg(format!("{session:016x}"))
            .arg("PX")
            .arg(ttl_ms(ttl));
        let _: Option<()> = self.query("response_put", &cmd).await;
    }

    /// Refreshes the key's TTL (a sticky turn).
    pub async fn refresh_ttl(&self, route: &str, sid: u64, ttl: Duration) {
        let key = binding_key(&self.cfg.key_prefix, route, sid);
        let _: Option<i64> = self
            .query("pexpire", redis::cmd("PEXPIRE").arg(&key).arg(ttl_ms(ttl)))
            .await;
    }

    /// Whether this replica agreed with Redis on the session within
    /// `SYNC_MS`, so its local copy can be trusted without a read.
    pub fn recently_synced(&self, route: &Arc<str>, sid: u64, now_ms: u64) -> bool {
        self.synced
            .lock()
            .get(&(Arc::clone(route), sid))
            .is_some_and(|s| now_ms.saturating_sub(s.at_ms) < SYNC_MS)
    }

    pub fn mark_synced(&self, route: &Arc<str>, sid: u64, now_ms: u64) {
        let mut synced = self.synced.lock();
        let entry = synced.entry((Arc::clone(route), sid)).or_insert(Synced {
            at_ms: now_ms,
            ttl_refreshed_ms: now_ms,
        });
        entry.at_ms = now_ms;
    }

    /// Whether a sticky turn should refresh the key's TTL now (at most every
    /// `ttl / 8`); notes that it will.
    pub fn ttl_refresh_due(&self, route: &Arc<str>, sid: u64, ttl: Duration, now_ms: u64) -> bool {
        let mut synced = self.synced.lock();
        let entry = synced.entry((Arc::clone(route), sid)).or_insert(Synced {
            at_ms: 0,
            ttl_refreshed_ms: 0,
        });
        if now_ms.saturating_sub(entry.ttl_refreshed_ms) < ttl_ms(ttl) / 8 {
            return false;
        }
        entry.ttl_refreshed_ms = now_ms;
        true
    }

    /// Forgets sync times older than `max_age_ms` (the store task's sweep).
    pub fn sweep_synced(&self, now_ms: u64, max_age_ms: u64) {
        self.synced
            .lock()
            .retain(|_, s| now_ms.saturating_sub(s.at_ms.max(s.ttl_refreshed_ms)) < max_age_ms);
    }

    /// A session placed while Redis was away, to write back on its return.
    pub fn mark_dirty(&self, route: &Arc<str>, sid: u64) {
        let mut dirty = self.dirty.lock();
        if dirty.len() < MAX_DIRTY {
            dirty.push((Arc::clone(route), sid));
        }
    }

    pub fn take_dirty(&self) -> Vec<(Arc<str>, u64)> {
        std::mem::take(&mut *self.dirty.lock())
    }
}

fn ttl_ms(ttl: Duration) -> u64 {
    (ttl.as_millis() as u64).max(1)
}

/// A replica id that differs between processes started together.
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}
