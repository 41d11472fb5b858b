//! The replayed workload: coding-agent conversations, generated
//! deterministically from a seed.
//!
//! Every session starts with the same system prompt (real agents share it, so
//! every engine caches it after a first request), then repeats: a user
//! message of tool output or code, a streamed reply that the client appends to
//! the history, and a think pause. A session ends when its next turn would
//! take the context past `max_context`; the next one starts in its slot with a
//! new session id. Everything a turn contains (text, `max_tokens`, think time)
//! is a pure function of (seed, slot, session generation, turn), so every
//! mode replays the same conversations, however fast each mode serves them.
//!
//! The first session of each slot is pre-aged to a random turn, so that the
//! run starts near steady state (a fleet of agents has sessions of every age)
//! instead of every session growing from 2k tokens in lockstep.
//!
//! In the `forks` scenario a session (the parent) may, after a turn, spawn
//! sub-agents: each starts from the parent's history as the parent last sent
//! it plus the reply it got (which made the `spawn_agents` tool call, as
//! an agent framework's task tool is called), adds a sub-task, and runs a
//! few turns of its own; the parent's next message is the sub-agents'
//! results (a `tool` message answering that call) instead of a user
//! message. Sub-agents run in slots of their own
//! (`subagent_slot`) numbered after the parents', one generation per fork.

use std::time::Duration;

use crate::conversation::Conversation;
use crate::text::{text, Rng, BYTES_PER_TOKEN, SIM_TOKEN};

/// What the workload looks like; see `--help` for the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadParams {
    pub seed: u64,
    pub slots: u32,
    pub system_tokens: usize,
    /// Inclusive range of a user message's length in tokens.
    pub user_tokens: (usize, usize),
    /// Inclusive range of a turn's `max_tokens`.
    pub max_tokens: (usize, usize),
    /// Inclusive range of the pause after a reply, in milliseconds.
    pub think_ms: (u64, u64),
    /// A session ends before its prompt would exceed this many tokens.
    pub max_context: usize,
    /// Slots whose sessions have another shape (the `skewed` scenario);
    /// None: every slot has the shape above.
    pub long: Option<LongSessions>,
    /// Parents spawn sub-agents (the `forks` scenario); None: never.
    pub forks: Option<Forks>,
    /// Each slot's first session starts at a random turn (a fleet of
    /// agents has sessions of every age); off, every session starts empty
    /// and they grow together (`outgrow`).
    pub pre_age: bool,
    /// Conversations start with their tenant's prefix instead of the shared
    /// system prompt and end after a few turns (`shared-prefix`).
    pub tenants: Option<Tenants>,
    /// Each request names its slot's tenant, quiet or noisy
    /// (`noisy-neighbor`, `scenario::noisy_tenant`).
    pub noisy_neighbor: bool,
    /// `noisy-neighbor --quiet-alone`: the noisy tenant's slots send nothing.
    pub quiet_alone: bool,
}

/// `shared-prefix`: tenants, each with a prefix of its own that all its
/// conversations start with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tenants {
    pub count: u32,
    pub prefix_tokens: usize,
    /// Turns per conversation, inclusive.
    pub turns: (u32, u32),
}

/// How parents spawn sub-agents.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forks {
    /// After each successful turn but a session's first, a fork with a
    /// chance of 1 in this.
    pub one_in: u64,
    /// Sub-agents per fork, inclusive.
    pub agents: (u32, u32),
    /// Turns per sub-agent, inclusive.
    pub turns: (u32, u32),
}

impl Forks {
    /// Sessions a parent and its sub-agents keep live on average, counting
    /// in turns: per parent turn, with a chance p a fork follows that lasts
    /// about the sub-agents' mean turns t, the parent waiting, with a mean
    /// of a sub-agents: (1 + p a t) / (1 + p t).
    pub fn mean_live(&self) -> f64 {
        let mean = |r: (u32, u32)| f64::from(r.0 + r.1) / 2.0;
        let p = 1.0 / self.one_in.max(1) as f64;
        let (a, t) = (mean(self.agents), mean(self.turns));
        (1.0 + p * a * t) / (1.0 + p * t)
    }
}

/// The first `slots` slots run long agent sessions: bigger user turns and a
/// larger context before the session ends. `max_tokens` and think times are
/// those of every slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LongSessions {
    pub slots: u32,
    pub user_tokens: (usize, usize),
    pub max_context: usize,
}

/// What differs between session slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub user_tokens: (usize, usize),
    pub max_context: usize,
}

impl WorkloadParams {
    /// The shape of the sessions of `slot`.
    pub fn shape(&self, slot: u32) -> Shape {
        match self.long {
            Some(l) if slot < l.slots => Shape {
                user_tokens: l.user_tokens,
                max_context: l.max_context,
            },
            _ => self.common(),
        }
    }

    /// The shape of every slot that is not long.
    pub fn common(&self) -> Shape {
        Shape {
            user_tokens: self.user_tokens,
            max_context: self.max_context,
        }
    }

    /// Slots with the long shape.
    pub fn long_slots(&self) -> u32 {
        self.long.map_or(0, |l| l.slots.min(self.slots))
    }

    /// Tokens a completed turn adds to the context, on average.
    pub fn mean_turn_tokens(&self, shape: Shape) -> usize {
        let u = shape.user_tokens;
        (u.0 + u.1) / 2 + (self.max_tokens.0 + self.max_tokens.1) / 2
    }

    /// Turns of a session from empty to its max context, on average.
    pub fn expected_turns(&self, shape: Shape) -> usize {
        (shape.max_context.saturating_sub(self.system_tokens) / self.mean_turn_tokens(shape).max(1))
            .max(1)
    }

    /// The average prompt of a live session: sessions are spread evenly over
    /// their lifetimes, so contexts are spread over system..max_context
    /// (a tenant's conversation: its prefix and half its turns).
    pub fn mean_context_of(&self, shape: Shape) -> usize {
        match self.tenants {
            Some(t) => {
                let turns = (t.turns.0 + t.turns.1) as usize;
                t.prefix_tokens + self.mean_turn_tokens(shape) * turns / 4
            }
            None => (self.system_tokens + shape.max_context) / 2,
        }
    }

    /// The average prompt of a live session over all slots.
    pub fn mean_context(&self) -> usize {
        let long = self.long_slots() as usize;
        let Some(l) = self.long.filter(|_| long > 0) else {
            return self.mean_context_of(self.common());
        };
        let long_shape = Shape {
            user_tokens: l.user_tokens,
            max_context: l.max_context,
        };
        let short = self.slots as usize - long;
        (long * self.mean_context_of(long_shape) + short * self.mean_context_of(self.common()))
            / self.slots as usize
    }
}

/// One turn of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnPlan {
    pub user: String,
    pub max_tokens: u32,
    /// Pause after this turn's reply before the next request.
    pub think: Duration,
}

/// The workload of one run: a pure function of its parameters.
#[derive(Debug, Clone)]
pub struct Workload {
    pub params: WorkloadParams,
    system: String,
    /// `shared-prefix`: each tenant's prefix.
    tenant_prefixes: Vec<String>,
}

impl Workload {
    pub fn new(params: WorkloadParams) -> Self {
        let mut rng = Rng::derive(params.seed, &[0x5359_5354]);
        let header = "You are a coding agent working in a Rust repository. Use the tools to read, \
                      edit and test code. Conventions and tool descriptions follow.";
        let bytes = (params.system_tokens * BYTES_PER_TOKEN)
            .saturating_sub("system".len())
            .max(header.len() + 1);
        let system = text(&mut rng, bytes, header);
        let tenant_prefixes = params.tenants.map_or_else(Vec::new, |t| {
            (0..t.count)
                .map(|tenant| {
                    let mut rng = Rng::derive(params.seed, &[8, u64::from(tenant)]);
                    let header = format!(
                        "You answer questions for tenant {tenant} from the documents below,                          which are theirs alone."
                    );
                    let bytes = (t.prefix_tokens * BYTES_PER_TOKEN).saturating_sub("system".len());
                    text(&mut rng, bytes.max(header.len() + 1), &header)
                })
                .collect()
        });
        Workload {
            params,
            system,
            tenant_prefixes,
        }
    }

    /// `shared-prefix`: the tenant of session (slot, generation), and how
    /// many turns it runs.
    pub fn tenant_of(&self, slot: u32, generation: u32) -> Option<(u32, u32)> {
        let t = self.params.tenants?;
        let mut rng = Rng::derive(
            self.params.seed,
            &[9, u64::from(slot), u64::from(generation)],
        );
        let tenant = rng.range(0, u64::from(t.count.max(1)) - 1) as u32;
        let turns = rng.range(u64::from(t.turns.0), u64::from(t.turns.1)) as u32;
        Some((tenant, turns.max(1)))
    }

    /// Whether session (slot, `c`) has run all its turns (a tenant's
    /// conversation runs a set number; the others end on their context).
    pub fn finished(&self, slot: u32, c: &Conversation) -> bool {
        self.tenant_of(slot, c.generation)
            .is_some_and(|(_, turns)| c.next_turn >= turns)
    }

    #[cfg(test)]
    pub fn system_prompt(&self) -> &str {
        &self.system
    }

    pub fn session_id(&self, slot: u32, generation: u32) -> String {
        format!("bench-{}-{slot}-{generation}", self.params.seed)
    }

    pub fn turn(&self, slot: u32, generation: u32, turn: u32) -> TurnPlan {
        let p = &self.params;
        let mut rng = Rng::derive(
            p.seed,
            &[1, u64::from(slot), u64::from(generation), u64::from(turn)],
        );
        // The header makes every session's first user message, and so every
        // prefix past the system prompt, its own.
        let header = format!(
            "[tool result: session {} turn {turn}]",
            self.session_id(slot, generation)
        );
        self.plan(&mut rng, p.shape(slot).user_tokens, &header)
    }

    /// A turn's plan drawn from `rng`: a user message of `user_tokens`
    /// (a range) opening with `header`, `max_tokens` and the pause after.
    fn plan(&self, rng: &mut Rng, user_tokens: (usize, usize), header: &str) -> TurnPlan {
        let p = &self.params;
        let tokens = rng.range(user_tokens.0 as u64, user_tokens.1 as u64) as usize;
        let max_tokens = rng.range(p.max_tokens.0 as u64, p.max_tokens.1 as u64) as u32;
        let think = Duration::from_millis(rng.range(p.think_ms.0, p.think_ms.1));
        let bytes = (tokens * BYTES_PER_TOKEN)
            .saturating_sub("user".len())
            .max(header.len() + 1);
        TurnPlan {
            user: text(rng, bytes, header),
            max_tokens: max_tokens.max(1),
            think,
        }
    }

    /// `forks`: the sub-agents that session (slot, generation) spawns after
    /// its successful turn `turn`, as each one's planned turns; None: no
    /// fork there (never after a session's first turn).
    pub fn fork_after(&self, slot: u32, generation: u32, turn: u32) -> Option<Vec<u32>> {
        let f = self.params.forks?;
        if turn == 0 {
            return None;
        }
        let mut rng = Rng::derive(
            self.params.seed,
            &[6, u64::from(slot), u64::from(generation), u64::from(turn)],
        );
        if rng.range(1, f.one_in) != 1 {
            return None;
        }
        let agents = rng.range(u64::from(f.agents.0), u64::from(f.agents.1));
        Some(
            (0..agents)
                .map(|_| rng.range(u64::from(f.turns.0), u64::from(f.turns.1)) as u32)
                .collect(),
        )
    }

    /// The slot of sub-agent `agent` of the parents in `parent_slot`: after
    /// every parent's slot, `forks.agents.1` per parent.
    pub fn subagent_slot(&self, parent_slot: u32, agent: u32) -> u32 {
        let per_parent = self.params.forks.map_or(1, |f| f.agents.1.max(1));
        self.params.slots + parent_slot * per_parent + agent
    }

    /// The session id of sub-agent `agent` of the `spawn`-th fork in
    /// `parent_slot` (forks counted over the slot's sessions).
    pub fn subagent_id(&self, parent_slot: u32, spawn: u32, agent: u32) -> String {
        format!(
            "bench-{}-{parent_slot}-fork{spawn}-{agent}",
            self.params.seed
        )
    }

    /// A sub-agent's conversation before its first turn: the parent's
    /// history as it stands (the messages of its last request and the reply
    /// to it), under the sub-agent's own id; generation = `spawn`.
    pub fn subagent(
        &self,
        parent: &Conversation,
        parent_slot: u32,
        spawn: u32,
        agent: u32,
    ) -> Conversation {
        parent.fork(self.subagent_id(parent_slot, spawn, agent), spawn)
    }

    /// Turn `turn` of a sub-agent: the first a sub-task (user message of
    /// half the shortest to the shortest user message of the parent's
    /// shape), the later ones tool output like a parent's.
    pub fn subagent_turn(&self, parent_slot: u32, spawn: u32, agent: u32, turn: u32) -> TurnPlan {
        let p = &self.params;
        let mut rng = Rng::derive(
            p.seed,
            &[
                7,
                u64::from(parent_slot),
                u64::from(spawn),
                u64::from(agent),
                u64::from(turn),
            ],
        );
        let user = p.shape(parent_slot).user_tokens;
        let range = if turn == 0 {
            ((user.0 / 2).max(1), user.0)
        } else {
            user
        };
        let id = self.subagent_id(parent_slot, spawn, agent);
        let header = if turn == 0 {
            format!("[sub-task for sub-agent {id}]")
        } else {
            format!("[tool result: session {id} turn {turn}]")
        };
        self.plan(&mut rng, range, &header)
    }

    /// The parent's message after a fork: each sub-agent's last reply
    /// (what an agent framework's task tool hands back), in order.
    pub fn fork_results(&self, results: &[(String, Option<String>)]) -> String {
        let mut out = String::new();
        for (id, reply) in results {
            out.push_str(&format!("[result of sub-agent {id}]\n"));
            out.push_str(
                reply
                    .as_deref()
                    .unwrap_or("(no result: the sub-agent did not finish)"),
            );
            out.push('\n');
        }
        out
    }

    /// When slot `slot` sends its first request, after the run starts:
    /// spread over one think time so the run does not open with a stampede.
    pub fn start_offset(&self, slot: u32) -> Duration {
        let mut rng = Rng::derive(self.params.seed, &[2, u64::from(slot)]);
        Duration::from_millis(rng.range(0, self.params.think_ms.1))
    }

    /// Completed turns in the slot's first session before the run starts.
    pub fn initial_age(&self, slot: u32) -> u32 {
        let mut rng = Rng::derive(self.params.seed, &[3, u64::from(slot)]);
        rng.range(
            0,
            self.params.expected_turns(self.params.shape(slot)) as u64 - 1,
        ) as u32
    }

    /// A new session in `slot`: the system prompt (its tenant's prefix) only.
    pub fn conversation(&self, slot: u32, generation: u32) -> Conversation {
        let mut c = Conversation::new(self.session_id(slot, generation), generation);
        let prefix = self
            .tenant_of(slot, generation)
            .and_then(|(tenant, _)| self.tenant_prefixes.get(tenant as usize));
        c.push("system", prefix.unwrap_or(&self.system).clone());
        c
    }

    /// The slot's first session, with `initial_age` completed turns of
    /// history (fewer if the context would not leave room for another turn).
    pub fn initial_conversation(&self, slot: u32) -> Conversation {
        let mut c = self.conversation(slot, 0);
        if !self.params.pre_age || self.params.tenants.is_some() {
            return c;
        }
        for k in 0..self.initial_age(slot) {
            let plan = self.turn(slot, 0, k);
            c.push("user", plan.user);
            c.push("assistant", SIM_TOKEN.repeat(plan.max_tokens as usize));
            let shape = self.params.shape(slot);
            if c.tokens() + shape.user_tokens.1 > shape.max_context {
                c.pop();
                c.pop();
                break;
            }
            c.next_turn = k + 1;
        }
        c
    }

    /// Whether `c` has room for a message within the `max_context` of
    /// `slot`'s shape (a sub-agent's: its parent's slot). A session always
    /// gets its first turn: the caller does not ask then.
    pub fn room_for(&self, slot: u32, c: &Conversation, role: &str, content: &str) -> bool {
        c.tokens_with(role, content) <= self.params.shape(slot).max_context
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn params() -> WorkloadParams {
        WorkloadParams {
            seed: 7,
            slots: 8,
            system_tokens: 2_000,
            user_tokens: (500, 3_000),
            max_tokens: (100, 300),
            think_ms: (500, 3_000),
            max_context: 60_000,
            long: None,
            forks: None,
            pre_age: true,
            tenants: None,
            noisy_neighbor: false,
            quiet_alone: false,
        }
    }

    #[test]
    fn same_seed_same_workload() {
        let a = Workload::new(params());
        let b = Workload::new(params());
        assert_eq!(a.system_prompt(), b.system_prompt());
        for slot in 0..4 {
            assert_eq!(a.turn(slot, 0, 3), b.turn(slot, 0, 3));
            assert_eq!(a.start_offset(slot), b.start_offset(slot));
            assert_eq!(a.initial_age(slot), b.initial_age(slot));
            assert_eq!(
                a.initial_conversation(slot).body("m", 10, None),
                b.initial_conversation(slot).body("m", 10, None)
            );
        }
    }

    #[test]
    fn other_seed_other_workload() {
        let a = Workload::new(params());
        let b = Workload::new(WorkloadParams {
            seed: 8,
            ..params()
        });
        assert_ne!(a.system_prompt(), b.system_prompt());
        assert_ne!(a.turn(0, 0, 0), b.turn(0, 0, 0));
    }

    #[test]
    fn sessions_share_only_the_system_prompt() {
        let w = Workload::new(params());
        let (a, b) = (w.turn(0, 0, 0), w.turn(1, 0, 0));
        assert_ne!(a.user, b.user);
        assert_ne!(w.turn(0, 0, 0).user, w.turn(0, 1, 0).user);
        // The difference starts right after the role, so no block past the
        // system prompt is shared.
        assert_ne!(a.user.as_bytes()[..64], b.user.as_bytes()[..64]);
        let (ca, cb) = (w.conversation(0, 0), w.conversation(1, 0));
        assert_eq!(ca.body("m", 1, None), cb.body("m", 1, None));
        assert_ne!(w.session_id(0, 0), w.session_id(0, 1));
    }

    #[test]
    fn turns_respect_their_ranges() {
        let w = Workload::new(params());
        for k in 0..200 {
            let t = w.turn(k % 5, k / 5, k);
            let tokens = (t.user.len() + 4).div_ceil(BYTES_PER_TOKEN);
            assert!((500..=3_000).contains(&tokens), "{tokens}");
            assert!((100..=300).contains(&t.max_tokens));
            assert!((500..=3_000).contains(&(t.think.as_millis() as u64)));
            assert!(t.user.is_ascii() && !t.user.contains(['"', '\\']));
        }
        let sys_tokens = (w.system_prompt().len() + 6).div_ceil(BYTES_PER_TOKEN);
        assert_eq!(sys_tokens, 2_000);
    }

    #[test]
    fn pre_aged_sessions_fit_and_are_spread() {
        let w = Workload::new(WorkloadParams {
            slots: 32,
            ..params()
        });
        let mut ages = Vec::new();
        for slot in 0..32 {
            let c = w.initial_conversation(slot);
            assert!(c.tokens() + 3_000 <= 60_000);
            assert_eq!(c.messages(), 1 + 2 * c.next_turn as usize);
            ages.push(c.next_turn);
        }
        assert!(ages.iter().any(|&a| a < 8) && ages.iter().any(|&a| a > 16));
    }

    #[test]
    fn long_slots_have_their_own_shape() {
        let w = Workload::new(WorkloadParams {
            slots: 8,
            user_tokens: (100, 1_000),
            max_context: 8_000,
            long: Some(LongSessions {
                slots: 2,
                user_tokens: (4_000, 12_000),
                max_context: 120_000,
            }),
            ..params()
        });
        let p = &w.params;
        assert_eq!(p.long_slots(), 2);
        assert_eq!(p.expected_turns(p.shape(0)), 14);
        assert_eq!(p.expected_turns(p.shape(2)), 8);
        // (2 x 61k + 6 x 5k) / 8.
        assert_eq!(p.mean_context(), 19_000);
        for k in 0..50 {
            let tokens = |slot| (w.turn(slot, 0, k).user.len() + 4).div_ceil(BYTES_PER_TOKEN);
            assert!((4_000..=12_000).contains(&tokens(1)), "{}", tokens(1));
            assert!((100..=1_000).contains(&tokens(2)), "{}", tokens(2));
        }
        for slot in 0..8 {
            let c = w.initial_conversation(slot);
            let shape = p.shape(slot);
            assert!(c.tokens() + shape.user_tokens.1 <= shape.max_context);
        }
        // More long slots than slots: all of them are long.
        let all_long = WorkloadParams {
            slots: 1,
            long: p.long,
            ..params()
        };
        assert_eq!(all_long.long_slots(), 1);
        assert_eq!(all_long.mean_context(), 61_000);
    }

    #[test]
    fn body_is_a_streaming_chat_request_and_tokens_match_the_engine() {
        let w = Workload::new(params());
        let mut c = w.conversation(0, 0);
        c.push("user", "abcd".repeat(10));
        let v: serde_json::Value =
            serde_json::from_slice(&c.body("sim-model", 42, None)).expect("json");
        assert_eq!(v["stream"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["max_tokens"], 42);
        assert_eq!(v["messages"][1]["role"], "user");
        let bytes: usize = v["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| m["role"].as_str().unwrap().len() + m["content"].as_str().unwrap().len())
            .sum();
        assert_eq!(c.tokens(), bytes.div_ceil(4));
        c.pop();
        assert_eq!(c.messages(), 1);
    }

    fn forks() -> Workload {
        Workload::new(WorkloadParams {
            forks: Some(Forks {
                one_in: 4,
                agents: (2, 3),
                turns: (2, 4),
            }),
            ..params()
        })
    }

    #[test]
    fn forks_are_seeded_and_within_their_ranges() {
        let w = forks();
        let mut seen = 0;
        for slot in 0..8 {
            assert_eq!(w.fork_after(slot, 0, 0), None, "never after a first turn");
            for turn in 1..100 {
                let f = w.fork_after(slot, 0, turn);
                assert_eq!(f, w.fork_after(slot, 0, turn));
                if let Some(turns) = f {
                    seen += 1;
                    assert!((2..=3).contains(&turns.len()), "{turns:?}");
                    assert!(turns.iter().all(|t| (2..=4).contains(t)), "{turns:?}");
                }
            }
        }
        // One in four of 792 turns.
        assert!((150..250).contains(&seen), "{seen}");
        assert_eq!(Workload::new(params()).fork_after(0, 0, 5), None);
        let f = w.params.forks.unwrap();
        // (1 + 2.5 x 3 / 4) / (1 + 3 / 4).
        assert!((f.mean_live() - 2.875 / 1.75).abs() < 1e-9);
    }

    #[test]
    fn a_subagents_first_request_extends_its_parents_history_exactly() {
        let w = forks();
        let slot = 3;
        let turn = (1..100)
            .find(|&t| w.fork_after(slot, 0, t).is_some())
            .expect("a fork");
        let mut parent = w.conversation(slot, 0);
        let mut last_request = Vec::new();
        for k in 0..=turn {
            let plan = w.turn(slot, 0, k);
            parent.push("user", plan.user);
            last_request = parent.body("m", plan.max_tokens, None);
            parent.push("assistant", SIM_TOKEN.repeat(plan.max_tokens as usize));
            parent.next_turn = k + 1;
        }
        let reply = parent.last_content().unwrap().to_string();
        let messages = |body: &[u8]| -> Vec<serde_json::Value> {
            let v: serde_json::Value = serde_json::from_slice(body).expect("json");
            v["messages"].as_array().expect("messages").clone()
        };
        let before = messages(&last_request);
        let agents = w.fork_after(slot, 0, turn).unwrap();
        let mut ids = Vec::new();
        let mut slots = Vec::new();
        for j in 0..agents.len() as u32 {
            let mut sub = w.subagent(&parent, slot, 2, j);
            assert_eq!((sub.generation, sub.next_turn), (2, 0));
            assert_eq!(sub.tokens(), parent.tokens());
            let task = w.subagent_turn(slot, 2, j, 0);
            sub.push("user", task.user.clone());
            let first = messages(&sub.body("m", task.max_tokens, Some(&sub.id)));
            // The parent's last request, message for message, then the
            // reply it got, then the sub-task.
            assert_eq!(first.len(), before.len() + 2);
            assert_eq!(first[..before.len()], before[..]);
            assert_eq!(
                first[before.len()],
                serde_json::json!({"role": "assistant", "content": reply})
            );
            assert_eq!(first[before.len() + 1]["role"], "user");
            assert_eq!(first[before.len() + 1]["content"], task.user.as_str());
            assert!(task
                .user
                .starts_with("[sub-task for sub-agent bench-7-3-fork2-"));
            // Its later turns are tool output of its own.
            let later = w.subagent_turn(slot, 2, j, 1);
            assert!(later
                .user
                .starts_with(&format!("[tool result: session {} turn 1]", sub.id)));
            ids.push(sub.id.clone());
            slots.push(w.subagent_slot(slot, j));
        }
        ids.dedup();
        assert_eq!(ids.len(), agents.len());
        // Sub-agents' slots come after every parent's, three per parent.
        assert_eq!(slots[..2], [8 + 9, 8 + 10]);
        let results = w.fork_results(&[("a".into(), Some("tok tok ".into())), ("b".into(), None)]);
        assert_eq!(
            results,
            "[result of sub-agent a]\ntok tok \n[result of sub-agent b]\n\
             (no result: the sub-agent did not finish)\n"
        );
    }

    #[test]
    fn prompt_cache_key_is_in_the_body_only_when_asked() {
        let w = Workload::new(params());
        let c = w.conversation(0, 0);
        let v: serde_json::Value =
            serde_json::from_slice(&c.body("m", 1, Some("bench-7-0-0"))).expect("json");
        assert_eq!(v["prompt_cache_key"], "bench-7-0-0");
        let v: serde_json::Value = serde_json::from_slice(&c.body("m", 1, None)).expect("json");
        assert!(v.get("prompt_cache_key").is_none());
    }
}
