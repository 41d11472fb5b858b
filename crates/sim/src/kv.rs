//! Tokenization stand-in and the KV block pool with prefix caching.
//!
//! The pool follows vLLM's (v1) accounting because a gateway reads its
//! results: a running sequence pins the cached blocks of its prompt, so a
//! block shared by several sequences is counted once; when a sequence ends
//! its blocks stay cached but idle, and idle blocks are the eviction
//! candidates (least recently used first). `kv_cache_usage_perc` is the
//! share of capacity pinned by running sequences, so an idle engine with a
//! warm cache reports 0, as vLLM does.

use std::collections::BTreeMap;

use ahash::AHashMap;
use serde_json::Value;

/// Bytes per simulated token: cheap, deterministic and close enough to BPE
/// on English text.
pub(crate) const BYTES_PER_TOKEN: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    Text,
    /// Anthropic Messages (`/v1/messages`).
    Messages,
    /// OpenAI Responses (`/v1/responses`).
    Responses,
}

/// A chat or Messages body's `messages`, each as its role and content.
fn messages(out: &mut Vec<u8>, body: &Value) -> Result<(), String> {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("`messages` must be an array")?;
    if messages.is_empty() {
        return Err("`messages` must not be empty".into());
    }
    for m in messages {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or("every message needs a string `role`")?;
        turn(out, role, m.get("content"))?;
    }
    Ok(())
}

/// The bytes that stand for the prompt: each turn's role followed by its
/// text, or the completion prompt. One conversation gives the same bytes
/// whichever API carries it (a system prompt is `system` and its text, a
/// reply `assistant` and its text), so a later turn whose history extends
/// an earlier one shares its prefix, and its cached blocks, on every API.
/// For Responses only the request's own part: `instructions` and `input`
/// (the engine puts a previous response's conversation before it).
pub(crate) fn prompt_bytes(kind: Kind, body: &Value) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    match kind {
        Kind::Chat => {
            messages(&mut out, body)?;
        }
        Kind::Text => match body.get("prompt") {
            Some(Value::String(s)) => out.extend_from_slice(s.as_bytes()),
            Some(Value::Array(items)) if !items.is_empty() => {
                for item in items {
                    match item {
                        Value::String(s) => out.extend_from_slice(s.as_bytes()),
                        // Token ids: 4 bytes each, so each one counts as exactly one token.
                        Value::Number(n) => {
                            let id = n
                                .as_u64()
                                .and_then(|id| u32::try_from(id).ok())
                                .ok_or("token ids must be integers in u32 range")?;
                            out.extend_from_slice(&id.to_le_bytes());
                        }
                        _ => return Err("`prompt` items must be strings or token ids".into()),
                    }
                }
            }
            Some(_) => return Err("`prompt` must be a string or a non-empty array".into()),
            None => return Err("`prompt` is required".into()),
        },
        Kind::Messages => {
            match body.get("system") {
                None | Some(Value::Null) => {}
                system @ Some(Value::String(_) | Value::Array(_)) => {
                    turn(&mut out, "system", system)?
                }
                Some(_) => return Err("`system` must be a string or an array of blocks".into()),
            }
            messages(&mut out, body)?;
        }
        Kind::Responses => {
            match body.get("instructions") {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => turn_text(&mut out, "system", s),
                Some(_) => return Err("`instructions` must be a string".into()),
            }
            match body.get("input") {
                Some(Value::String(s)) => turn_text(&mut out, "user", s),
                Some(Value::Array(items)) if !items.is_empty() => {
                    for item in items {
                        response_item(&mut out, item)?;
                    }
                }
                Some(_) => return Err("`input` must be a string or a non-empty array".into()),
                None => return Err("`input` is required".into()),
            }
        }
    }
    Ok(out)
}

/// A whole text turn: its role, then its text.
pub(crate) fn turn_text(out: &mut Vec<u8>, role: &str, text: &str) {
    out.extend_from_slice(role.as_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// One turn: its role, then its content, a string or an array of parts
/// (blocks). Text parts (`text`, and the Responses API's `input_text` and
/// `output_text`) count by their text, an Anthropic tool call by its name
/// and input, a tool result by its content; others (images, audio,
/// thinking) have no token model here.
fn turn(out: &mut Vec<u8>, role: &str, content: Option<&Value>) -> Result<(), String> {
    out.extend_from_slice(role.as_bytes());
    content_bytes(out, content)
}

fn content_bytes(out: &mut Vec<u8>, content: Option<&Value>) -> Result<(), String> {
    match content {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => out.extend_from_slice(s.as_bytes()),
        Some(Value::Array(parts)) => {
            for part in parts {
                if !part.is_object() {
                    return Err("content parts must be objects".into());
                }
                match part.get("type").and_then(Value::as_str) {
                    Some("text" | "input_text" | "output_text") => {
                        let text = part
                            .get("text")
                            .and_then(Value::as_str)
                            .ok_or("a text part needs a string `text`")?;
                        out.extend_from_slice(text.as_bytes());
                    }
                    Some("tool_use") => {
                        let name = part.get("name").and_then(Value::as_str).unwrap_or("");
                        out.extend_from_slice(name.as_bytes());
                        if let Some(input) = part.get("input") {
                            out.extend_from_slice(input.to_string().as_bytes());
                        }
                    }
                    Some("tool_result") => content_bytes(out, part.get("content"))?,
                    _ => {}
                }
            }
        }
        Some(_) => return Err("`content` must be a string or an array of parts".into()),
    }
    Ok(())
}

/// One item of a Responses `input`: a message (with a `role`, typed
/// `message` or not), a function call or its output; other items
/// (reasoning) have no token model here.
fn response_item(out: &mut Vec<u8>, item: &Value) -> Result<(), String> {
    if !item.is_object() {
        return Err("`input` items must be objects".into());
    }
    let text = |key: &str| item.get(key).and_then(Value::as_str).unwrap_or("");
    match item.get("type").and_then(Value::as_str) {
        None | Some("message") => {
            let role = item
                .get("role")
                .and_then(Value::as_str)
                .ok_or("a message item needs a string `role`")?;
            turn(out, role, item.get("content"))
        }
        Some("function_call") => {
            out.extend_from_slice(b"assistant");
            out.extend_from_slice(text("name").as_bytes());
            out.extend_from_slice(text("arguments").as_bytes());
            Ok(())
        }
        Some("function_call_output") => {
            turn_text(out, "tool", text("output"));
            Ok(())
        }
        Some(_) => Ok(()),
    }
}

pub(crate) fn token_count(prompt: &[u8]) -> usize {
    prompt.len().div_ceil(BYTES_PER_TOKEN).max(1)
}

/// Hashes of the prompt's complete blocks, each chained from the previous
/// one so that a block's identity includes everything before it (as in
/// vLLM): two prompts share block `k` only if they share all of blocks `0..=k`.
pub(crate) fn block_hashes(prompt: &[u8], block_tokens: usize) -> Vec<u64> {
    // Fixed seeds: a block's hash must be the same for every request.
    let hasher = ahash::RandomState::with_seeds(0x5157_2d6b_7663, 0x6163_6865, 0x7072_6566, 0x6978);
    let full_blocks = token_count(prompt) / block_tokens;
    let block_bytes = block_tokens * BYTES_PER_TOKEN;
    let mut prev = 0u64;
    (0..full_blocks)
        .map(|k| {
            // The last complete block may end in a partial token when the
            // prompt length is not a multiple of 4; it hashes what is there.
            let start = k * block_bytes;
            let end = (start + block_bytes).min(prompt.len());
            prev = hasher.hash_one((prev, &prompt[start..end]));
            prev
        })
        .collect()
}

#[derive(Debug)]
struct Block {
    /// Running sequences using this block; 0 means idle and evictable.
    refs: u32,
    /// Position in the idle LRU order, valid while `refs == 0`.
    tick: u64,
}

/// The KV held by one running sequence.
#[derive(Debug, Default)]
pub(crate) struct SeqKv {
    /// Pinned shared blocks, in prompt order.
    blocks: Vec<u64>,
    /// Tokens in no shared block: the prompt not yet published to the cache
    /// and the generated tokens.
    private: usize,
}

#[derive(Debug)]
pub(crate) struct KvPool {
    capacity: usize,
    block_tokens: usize,
    blocks: AHashMap<u64, Block>,
    /// Idle blocks by tick, oldest first.
    idle: BTreeMap<u64, u64>,
    tick: u64,
    /// Tokens held by running sequences: pinned blocks plus private tokens.
    used: usize,
}

impl KvPool {
    pub fn new(capacity_tokens: usize, block_tokens: usize) -> Self {
        KvPool {
            capacity: capacity_tokens,
            block_tokens: block_tokens.max(1),
            blocks: AHashMap::new(),
            idle: BTreeMap::new(),
            tick: 0,
            used: 0,
        }
    }

    /// Admits a sequence: pins the leading cached blocks of its prompt and
    /// reserves the rest. Returns the KV handle and the cached token count.
    pub fn admit(&mut self, hashes: &[u64], prompt_tokens: usize) -> (SeqKv, usize) {
        // The last prompt token is always computed, because its logits give
        // the first output token; like vLLM, a fully cached prompt therefore
        // hits one block less.
        let max_hit_blocks = prompt_tokens.saturating_sub(1) / self.block_tokens;
        let hits = hashes
            .iter()
            .take(max_hit_blocks)
            .take_while(|h| self.blocks.contains_key(*h))
            .count();
        let mut seq = SeqKv {
            blocks: Vec::with_capacity(hashes.len()),
            private: prompt_tokens.saturating_sub(hits * self.block_tokens),
        };
        for &h in &hashes[..hits] {
            self.pin(h);
            seq.blocks.push(h);
        }
        self.used += seq.private;
        self.evict_to_fit();
        (seq, hits * self.block_tokens)
    }

    /// After prefill, the prompt's remaining complete blocks become cached
    /// (shared) blocks. One another sequence published meanwhile is reused.
    pub fn publish_prompt(&mut self, seq: &mut SeqKv, hashes: &[u64]) {
        for &h in hashes.iter().skip(seq.blocks.len()) {
            if self.blocks.contains_key(&h) {
                self.pin(h);
            } else {
                self.blocks.insert(h, Block { refs: 1, tick: 0 });
                self.used += self.block_tokens;
            }
            let moved = self.block_tokens.min(seq.private);
            seq.private -= moved;
            self.used -= moved;
            seq.blocks.push(h);
        }
        self.evict_to_fit();
    }

    pub fn grow(&mut self, seq: &mut SeqKv, tokens: usize) {
        seq.private += tokens;
        self.used += tokens;
        self.evict_to_fit();
    }

    pub fn release(&mut self, seq: SeqKv) {
        self.used = self.used.saturating_sub(seq.private);
        // Tail first: it becomes older in LRU order than the head, so
        // eviction trims a cached prefix from its end and what remains is
        // still a usable prefix (vLLM frees blocks in reverse for this reason).
        for &h in seq.blocks.iter().rev() {
            self.unpin(h);
        }
    }

    fn pin(&mut self, h: u64) {
        if let Some(b) = self.blocks.get_mut(&h) {
            if b.refs == 0 {
                self.idle.remove(&b.tick);
                self.used += self.block_tokens;
            }
            b.refs += 1;
        }
    }

    fn unpin(&mut self, h: u64) {
        if let Some(b) = self.blocks.get_mut(&h) {
            b.refs = b.refs.saturating_sub(1);
            if b.refs == 0 {
                self.tick += 1;
                b.tick = self.tick;
                self.idle.insert(self.tick, h);
                self.used = self.used.saturating_sub(self.block_tokens);
            }
        }
    }

    /// Drops idle blocks, oldest first, until running sequences plus the
    /// cache fit. Running sequences alone may exceed capacity (vLLM would
    /// preempt); then the cache is simply empty and usage reads 100%.
    fn evict_to_fit(&mut self) {
        while self.used + self.idle.len() * self.block_tokens > self.capacity {
            match self.idle.pop_first() {
                Some((_, h)) => {
                    self.blocks.remove(&h);
                }
                None => break,
            }
        }
    }

    pub fn usage(&self) -> f64 {
        if self.capacity == 0 {
            return if self.used > 0 { 1.0 } else { 0.0 };
        }
        (self.used as f64 / self.capacity as f64).clamp(0.0, 1.0)
    }

    pub fn cached_blocks(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(tag: u8, tokens: usize) -> Vec<u8> {
        (0..tokens * BYTES_PER_TOKEN)
            .map(|i| tag.wrapping_add(i as u8))
            .collect()
    }

    #[test]
    fn block_hashes_are_chained_prefixes() {
        let a = prompt(1, 40);
        let mut b = a.clone();
        b.extend_from_slice(b"more text after the shared prefix");
        let ha = block_hashes(&a, 16);
        let hb = block_hashes(&b, 16);
        assert_eq!(ha.len(), 2);
        assert_eq!(&hb[..2], &ha[..]);
        // Same block content after a different first block: different identity.
        let mut c = prompt(9, 16);
        c.extend_from_slice(&a[64..128]);
        assert_ne!(block_hashes(&c, 16)[1], ha[1]);
    }

    #[test]
    fn token_count_rounds_up_and_is_at_least_one() {
        assert_eq!(token_count(b""), 1);
        assert_eq!(token_count(b"abcd"), 1);
        assert_eq!(token_count(b"abcde"), 2);
    }

    #[test]
    fn shared_blocks_count_once_and_idle_cache_is_not_usage() {
        let mut kv = KvPool::new(1000, 16);
        let h = block_hashes(&prompt(1, 50), 16);
        let (mut s1, cached) = kv.admit(&h, 50);
        assert_eq!(cached, 0);
        kv.publish_prompt(&mut s1, &h);
        assert_eq!(kv.used, 50);
        let (mut s2, cached) = kv.admit(&h, 50);
        assert_eq!(cached, 48);
        kv.publish_prompt(&mut s2, &h);
        assert_eq!(kv.used, 48 + 2 + 2);
        kv.release(s1);
        kv.release(s2);
        assert_eq!(kv.used, 0);
        assert_eq!(kv.usage(), 0.0);
        assert_eq!(kv.cached_blocks(), 3);
    }

    #[test]
    fn fully_cached_prompt_still_computes_its_last_block() {
        let mut kv = KvPool::new(1000, 16);
        let h = block_hashes(&prompt(1, 32), 16);
        let (mut s, _) = kv.admit(&h, 32);
        kv.publish_prompt(&mut s, &h);
        kv.release(s);
        let (s, cached) = kv.admit(&h, 32);
        assert_eq!(cached, 16);
        kv.release(s);
    }

    #[test]
    fn eviction_trims_prefixes_from_the_tail() {
        // While B (49 tokens) runs, only 31 tokens are left for idle blocks:
        // A's 3 cached blocks must shrink to 1, and it must be the head.
        let mut kv = KvPool::new(80, 16);
        let a = block_hashes(&prompt(1, 49), 16);
        let b = block_hashes(&prompt(2, 49), 16);
        for h in [&a, &b] {
            let (mut s, _) = kv.admit(h, 49);
            kv.publish_prompt(&mut s, h);
            kv.release(s);
        }
        assert!(kv.blocks.contains_key(&a[0]));
        assert!(!kv.blocks.contains_key(&a[2]));
        let (s, cached) = kv.admit(&a, 49);
        assert_eq!(cached, 16);
        kv.release(s);
    }
}
