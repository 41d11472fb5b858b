//! The route's memory of conversations it has seen, by content: the keyed
//! hash of every prefix of every request's chain of blocks (a node), the
//! session each node belongs to, and each session's latest request.
//!
//! A request is matched by its longest known prefix:
//! - none: a new conversation, its session the keyed hash of its last node
//!   (the same on every replica that shares the key);
//! - the latest request of session S, whole (or, when that request ended
//!   in a string still growing, its last full chunk), continued by the
//!   model's own output: a later turn of S. A request that continues it
//!   with a user message instead is a sub-agent handed the parent's
//!   history: a fork;
//! - any other node of S: a fork (an edited or regenerated turn, a
//!   sub-agent): a session of its own, placed next to S where the shared
//!   prefix is cached;
//! - a node with [`ContentConfig::template_fanout`] distinct continuations
//!   or more (a system prompt, a template, a few-shot block shared by many
//!   conversations): it decides nothing, the request is a new conversation
//!   placed by load. Counting continuations is what keeps the prefix-tree
//!   routers' failure (every conversation on the engine holding the
//!   shared system prompt) away.
//!
//! Two memories ride along, for the same route: each Responses API
//! answer's id (its hash) → the session it answered
//! ([`ContentIndex::remember_response`]), and, per template, the engines
//! it was sent to lately ([`ContentIndex::hold`], [`ContentIndex::holders`]:
//! the gateway's `balance/prefix.rs` prices a newcomer by them).
//!
//! Bounded: nodes and sessions unused for `idle_ms` are swept, and at
//! `max_nodes` the least recently used go, one-off conversations first.
//! Only keyed hashes are kept (SipHash-1-3 under the route's key of each
//! chain value), never content.

use ahash::AHashMap;
use parking_lot::Mutex;
use siphasher::sip::SipHasher13;
use std::cell::Cell;
use std::hash::Hasher;

use super::blocks::Block;

use super::blocks::CHAIN_SEED;
/// Probes from the request's end before the search halves the rest: a
/// later turn adds an assistant message and a user one, a few blocks.
const NEAR_PROBES: usize = 8;
/// Templates whose engines are remembered at most, and engines per template.
const MAX_TEMPLATES: usize = 4_096;
const MAX_HOLDERS: usize = 8;
/// The gateway's estimate of a token: bytes / 4.
const BYTES_PER_TOKEN: u64 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentConfig {
    /// Distinct continuations that make a node a template (0: no
    /// template rule, every shared prefix links conversations).
    pub template_fanout: u16,
    pub idle_ms: u64,
    pub max_nodes: usize,
}

impl Default for ContentConfig {
    fn default() -> Self {
        ContentConfig {
            template_fanout: 4,
            idle_ms: 30 * 60 * 1000,
            max_nodes: 500_000,
        }
    }
}

/// What the index made of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recognised {
    pub session: u64,
    pub how: How,
    /// Blocks of the request found in the index (its longest known prefix).
    pub matched: usize,
    pub blocks: usize,
    /// The request's last node (keyed) and its depth, and its stem (the
    /// last full chunk of a string still growing): what the next turn
    /// passes through, for another replica to find.
    pub tip: (u64, usize),
    pub stem: Option<(u64, usize)>,
    /// A new conversation that shares a prefix with others (a template, a
    /// forked parent's history): that prefix's node, for the engines it was
    /// sent to ([`ContentIndex::holders`]).
    pub template: Option<Template>,
}

/// A template a new conversation starts with (a system prompt with its
/// documents, a few-shot block): its keyed node and its size in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Template {
    pub node: u64,
    pub tokens: u64,
}

/// An engine a template was sent to: its id, the caller's mark of how much
/// the engine had taken in then, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    pub peer: u32,
    pub mark: u64,
    pub at_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// First seen: a new conversation (or one sharing only a template).
    New,
    /// A later turn of a known conversation (or the same request again).
    Continued,
    /// A new conversation branching off `parent`'s history.
    Forked { parent: u64 },
}

impl How {
    pub fn as_str(self) -> &'static str {
        match self {
            How::New => "new",
            How::Continued => "continued",
            How::Forked { .. } => "forked",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Node {
    session: u64,
    /// Distinct continuations seen (saturating).
    children: u16,
    last_ms: u64,
}

#[derive(Debug, Clone, Copy)]
struct Latest {
    /// The keyed node of the session's latest request's last block, and
    /// its depth (blocks).
    tip: (u64, usize),
    /// Its last full chunk when its last string went on past one.
    stem: Option<(u64, usize)>,
    last_ms: u64,
    /// Requests seen (saturating): a full index forgets one-off
    /// conversations first.
    turns: u16,
}

#[derive(Default)]
struct State {
    config: ContentConfig,
    nodes: AHashMap<u64, Node>,
    sessions: AHashMap<u64, Latest>,
    /// A Responses API response id (its hash) → the session it answered.
    responses: AHashMap<u64, (u64, u64)>,
    /// A template's node → the engines it was recently sent to.
    holders: AHashMap<u64, Vec<Holder>>,
}

pub struct ContentIndex {
    key: (u64, u64),
    state: Mutex<State>,
}

impl ContentIndex {
    pub fn new(key: (u64, u64), config: ContentConfig) -> Self {
        ContentIndex {
            key,
            state: Mutex::new(State {
                config,
                ..State::default()
            }),
        }
    }

    /// A reload's settings; what is remembered stays.
    pub fn set_config(&self, config: ContentConfig) {
        self.state.lock().config = config;
    }

    /// The session that produced response `response` (a hash of its id),
    /// for the next turn's `previous_response_id`.
    pub fn session_of_response(&self, response: u64, now_ms: u64) -> Option<u64> {
        let state = self.state.lock();
        let idle = state.config.idle_ms;
        state
            .responses
            .get(&response)
            .filter(|(_, at)| now_ms.saturating_sub(*at) <= idle)
            .map(|(session, _)| *session)
    }

    /// Response `response` answered a turn of `session`.
    pub fn remember_response(&self, response: u64, session: u64, now_ms: u64) {
        let mut state = self.state.lock();
        if state.responses.len() < state.config.max_nodes {
            state.responses.insert(response, (session, now_ms));
        }
    }

    /// The chain of `blocks`: each value covers every block up to its own
    /// (what [`BlockSink::finish`](super::BlockSink::finish) sets as each
    /// block's `chain`).
    pub fn chain(blocks: &[Block]) -> Vec<u64> {
        let mut at = CHAIN_SEED;
        blocks
            .iter()
            .map(|b| {
                at = crate::hash::mix64(at, b.digest);
                at
            })
            .collect()
    }

    #[cfg(test)]
    pub(super) fn keyed_for_tests(&self, chain: u64) -> u64 {
        self.keyed(chain)
    }

    fn keyed(&self, chain: u64) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.key.0, self.key.1);
        h.write_u64(chain);
        h.finish()
    }

    /// The session of a request whose conversation is `blocks`, and the
    /// request remembered for the next; `None` for a request with no
    /// conversation in it.
    pub fn recognise(&self, blocks: &[Block], now_ms: u64) -> Option<Recognised> {
        self.judge(blocks, now_ms, true)
    }

    /// What [`recognise`](Self::recognise) would answer, remembering
    /// nothing (`/_route_inspect`).
    pub fn peek(&self, blocks: &[Block], now_ms: u64) -> Option<Recognised> {
        self.judge(blocks, now_ms, false)
    }

    fn judge(&self, blocks: &[Block], now_ms: u64, remember: bool) -> Option<Recognised> {
        if blocks.is_empty() {
            return None;
        }
        // Keyed only where looked at or written (a later turn probes and
        // adds a few nodes of a chain that may hold hundreds), and the few
        // looked at again (the match, the end) kept: no allocation, where
        // the chain and its keys in two vectors were a fifth of the cost.
        let keys = KeyCache::default();
        let key = |i: usize| keys.get(i, || self.keyed(blocks[i].chain));
        let state = &mut *self.state.lock();
        let config = state.config;
        let idle = config.idle_ms;
        let live = |n: &Node, st: &State| {
            now_ms.saturating_sub(n.last_ms) <= idle
                || st
                    .sessions
                    .get(&n.session)
                    .is_some_and(|s| now_ms.saturating_sub(s.last_ms) <= idle)
        };
        let known = |i: usize, st: &State| st.nodes.get(&key(i)).is_some_and(|n| live(n, st));
        let n = blocks.len();
        let matched = longest_known(n, |i| known(i, state));
        let last = key(n - 1);
        let mut shared = None;
        let (session, how) = match matched {
            None => (last, How::New),
            Some(m) => {
                let node = state.nodes[&key(m)];
                let latest = state.sessions.get(&node.session).copied();
                // Passes through `at`, a node at or above the match.
                let through = |at: (u64, usize)| {
                    let (at_key, depth) = at;
                    depth >= 1 && depth <= m + 1 && key(depth - 1) == at_key
                };
                // Through the whole latest request, the blocks after it
                // decide; else a string that grew in place ends its match
                // exactly at its last full chunk.
                let continues = latest.is_some_and(|l| {
                    if through(l.tip) {
                        answers(blocks, l.tip.1)
                    } else {
                        l.stem
                            .is_some_and(|(stem, depth)| depth == m + 1 && key(m) == stem)
                    }
                });
                let template =
                    config.template_fanout > 0 && node.children >= config.template_fanout;
                if m + 1 == n || continues {
                    (node.session, How::Continued)
                } else {
                    // Shared with another conversation: where it was sent
                    // is worth remembering from the first fork on, so that
                    // the prefix's engines are known when it turns template.
                    let bytes: u64 = blocks[..=m].iter().map(|b| u64::from(b.bytes)).sum();
                    shared = Some(Template {
                        node: key(m),
                        tokens: bytes / BYTES_PER_TOKEN,
                    });
                    if template || latest.is_none() {
                        (last, How::New)
                    } else {
                        (
                            last,
                            How::Forked {
                                parent: node.session,
                            },
                        )
                    }
                }
            }
        };
        // A last string still growing: its next turn passes through its
        // last full chunk, not through its end.
        let stem = (n >= 2 && blocks[n - 2].chunk).then(|| (key(n - 2), n - 1));
        let recognised = Recognised {
            session,
            how,
            matched: matched.map_or(0, |m| m + 1),
            blocks: n,
            tip: (last, n),
            stem,
            template: shared,
        };
        if !remember {
            return Some(recognised);
        }
        let from = matched.map_or(0, |m| m + 1);
        if let Some(m) = matched {
            if let Some(node) = state.nodes.get_mut(&key(m)) {
                node.last_ms = now_ms;
                if from < n {
                    node.children = node.children.saturating_add(1);
                }
            }
        }
        // A fork handed its parent's reply: the reply is the parent's, so
        // that the parent's next turn, and the fork's siblings, find it
        // there.
        let parents_reply = match how {
            How::Forked { parent } => state
                .sessions
                .get(&parent)
                .filter(|l| l.tip.1 >= 1 && l.tip.1 <= from && key(l.tip.1 - 1) == l.tip.0)
                .map(|l| l.tip.1)
                .filter(|&at| blocks.get(at).is_some_and(|b| b.assistant))
                .map(|at| {
                    (
                        parent,
                        at..=at + blocks[at..].iter().take_while(|b| b.chunk).count(),
                    )
                }),
            _ => None,
        };
        if state.nodes.len() + (n - from) > config.max_nodes {
            Self::make_room(state, now_ms);
        }
        let room = config.max_nodes.saturating_sub(state.nodes.len());
        if n - from <= room {
            for i in from..n {
                let owner = match &parents_reply {
                    Some((parent, reply)) if reply.contains(&i) => *parent,
                    _ => session,
                };
                state.nodes.insert(
                    key(i),
                    Node {
                        session: owner,
                        children: u16::from(i + 1 < n),
                        last_ms: now_ms,
                    },
                );
            }
        }
        let turns = state.sessions.get(&session).map_or(0, |l| l.turns);
        state.sessions.insert(
            session,
            Latest {
                tip: (last, n),
                stem,
                last_ms: now_ms,
                turns: turns.saturating_add(1),
            },
        );
        Some(recognised)
    }

    /// The nodes another replica may know this request by, when this
    /// index knows none of them: its last few (keyed, with their depth),
    /// where a later turn finds the request it continues. `None` when
    /// the index has an answer of its own nearby.
    pub fn missing_near(&self, blocks: &[Block], now_ms: u64) -> Option<Vec<(u64, usize)>> {
        let n = blocks.len();
        let near: Vec<(u64, usize)> = (n.saturating_sub(NEAR_PROBES)..n)
            .rev()
            .map(|i| (self.keyed(blocks[i].chain), i + 1))
            .collect();
        let state = self.state.lock();
        let idle = state.config.idle_ms;
        let known = near.iter().any(|(k, _)| {
            state
                .nodes
                .get(k)
                .is_some_and(|node| now_ms.saturating_sub(node.last_ms) <= idle)
        });
        (!near.is_empty() && !known).then_some(near)
    }

    /// Takes what another replica wrote: node `key` at `depth` is the end
    /// of `session`'s latest request (or, `stem`, its last full chunk).
    pub fn adopt(&self, key: u64, depth: usize, session: u64, stem: bool, now_ms: u64) {
        let mut state = self.state.lock();
        if state.nodes.len() >= state.config.max_nodes {
            return;
        }
        state.nodes.entry(key).or_insert(Node {
            session,
            children: 0,
            last_ms: now_ms,
        });
        let latest = state.sessions.entry(session).or_insert(Latest {
            tip: (key, depth),
            stem: None,
            last_ms: now_ms,
            turns: 1,
        });
        latest.last_ms = now_ms;
        if stem {
            latest.stem = Some((key, depth));
        } else if latest.tip.1 <= depth {
            latest.tip = (key, depth);
        }
    }

    /// The engines `template` was sent to, most recent first.
    pub fn holders(&self, template: u64) -> Vec<Holder> {
        let state = self.state.lock();
        let mut holders = state.holders.get(&template).cloned().unwrap_or_default();
        holders.sort_unstable_by_key(|h| std::cmp::Reverse(h.at_ms));
        holders
    }

    /// `template` was sent to engine `peer`, whose intake mark was `mark`.
    pub fn hold(&self, template: u64, peer: u32, mark: u64, now_ms: u64) {
        let state = &mut *self.state.lock();
        if state.holders.len() >= MAX_TEMPLATES && !state.holders.contains_key(&template) {
            // The quarter used least recently makes room, in one pass
            // (amortised: one scan per quarter of the cap, not per insert).
            let last_used = |hs: &Vec<Holder>| hs.iter().map(|h| h.at_ms).max().unwrap_or(0);
            let mut ages: Vec<u64> = state.holders.values().map(last_used).collect();
            let cut = ages.len() / 4;
            let (_, &mut horizon, _) = ages.select_nth_unstable(cut);
            state.holders.retain(|_, hs| last_used(hs) > horizon);
        }
        let holders = state.holders.entry(template).or_default();
        let holder = Holder {
            peer,
            mark,
            at_ms: now_ms,
        };
        let same = holders.iter().position(|h| h.peer == peer);
        let oldest = || {
            holders
                .iter()
                .enumerate()
                .min_by_key(|(_, h)| h.at_ms)
                .map(|(i, _)| i)
        };
        match same {
            Some(i) => holders[i] = holder,
            None if holders.len() < MAX_HOLDERS => holders.push(holder),
            None => {
                if let Some(i) = oldest() {
                    holders[i] = holder;
                }
            }
        }
    }

    /// Nodes and sessions held (for `/_route_inspect` and the tests).
    pub fn len(&self) -> (usize, usize) {
        let state = self.state.lock();
        (state.nodes.len(), state.sessions.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len().0 == 0
    }

    /// Drops what has not been used for `idle_ms` (the route's sweeper
    /// calls it; what has expired and is not yet swept is never matched).
    pub fn sweep(&self, now_ms: u64) {
        let mut state = self.state.lock();
        self.sweep_now(&mut state, now_ms);
    }

    fn sweep_now(&self, state: &mut State, now_ms: u64) {
        let idle = state.config.idle_ms;
        Self::forget_older_than(state, now_ms, idle, false);
        state
            .responses
            .retain(|_, (_, at)| now_ms.saturating_sub(*at) <= idle);
        state.holders.retain(|_, holders| {
            holders.retain(|h| now_ms.saturating_sub(h.at_ms) <= idle);
            !holders.is_empty()
        });
    }

    /// The index is full: what was used least recently goes, one-off
    /// conversations before those that went on, the horizon halving until
    /// a quarter of the cap is free. So a flood of one-off requests costs
    /// the conversations still going on nothing, and the scan is paid once
    /// per quarter of the cap.
    fn make_room(state: &mut State, now_ms: u64) {
        let target = state.config.max_nodes / 4 * 3;
        for one_offs_only in [true, false] {
            let mut horizon = state.config.idle_ms;
            while state.nodes.len() > target && horizon > 0 {
                horizon /= 2;
                Self::forget_older_than(state, now_ms, horizon, one_offs_only);
            }
        }
    }

    /// Forgets sessions unused for `idle` (only those seen once, with
    /// `one_offs_only`), and the nodes no kept session holds and no
    /// request matched within `idle`.
    fn forget_older_than(state: &mut State, now_ms: u64, idle: u64, one_offs_only: bool) {
        state.sessions.retain(|_, s| {
            now_ms.saturating_sub(s.last_ms) <= idle || (one_offs_only && s.turns > 1)
        });
        let State {
            nodes, sessions, ..
        } = state;
        nodes.retain(|_, n| {
            now_ms.saturating_sub(n.last_ms) <= idle || sessions.contains_key(&n.session)
        });
    }
}

/// Whether the blocks from `at` on are what a conversation adds after
/// its last request: the model's reply (or nothing: the same request
/// again), and, when that reply asked for tools, their results. A reply
/// that asked for tools followed by a user message is a sub-agent handed
/// the history up to the call, not the conversation going on.
fn answers(blocks: &[Block], at: usize) -> bool {
    let Some(reply) = blocks.get(at) else {
        return true;
    };
    if !reply.assistant {
        return false;
    }
    if !reply.calls_tool {
        return true;
    }
    let reply_end = at + blocks[at..].iter().take_while(|b| b.chunk).count();
    blocks
        .get(reply_end + 1)
        .is_none_or(|next| next.tool_result || next.assistant)
}

/// The bytes of one node's and one session's entry in their maps (key
/// and value), for the memory the README states.
#[cfg(test)]
pub(super) fn entry_sizes() -> (usize, usize) {
    (
        std::mem::size_of::<(u64, Node)>(),
        std::mem::size_of::<(u64, Latest)>(),
    )
}

/// The deepest `i` with `known(i)`: the last few from the end one by one
/// (a later turn), then halving the rest, which a conversation's own
/// nodes make a prefix-closed set.
/// The keyed hashes [`ContentIndex::judge`] computed last, by block index,
/// direct-mapped: the match and the end are looked at several times, and a
/// SipHash of each costs more than this look-up.
struct KeyCache([Cell<(usize, u64)>; 8]);

impl Default for KeyCache {
    fn default() -> Self {
        KeyCache(std::array::from_fn(|_| Cell::new((usize::MAX, 0))))
    }
}

impl KeyCache {
    fn get(&self, i: usize, key: impl FnOnce() -> u64) -> u64 {
        let slot = &self.0[i % self.0.len()];
        match slot.get() {
            (at, k) if at == i => k,
            _ => {
                let k = key();
                slot.set((i, k));
                k
            }
        }
    }
}

fn longest_known(n: usize, known: impl Fn(usize) -> bool) -> Option<usize> {
    let near_end = n.saturating_sub(NEAR_PROBES);
    if let Some(i) = (near_end..n).rev().find(|&i| known(i)) {
        return Some(i);
    }
    let (mut lo, mut hi) = (0, near_end);
    let mut best = None;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if known(mid) {
            best = Some(mid);
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    best
}
