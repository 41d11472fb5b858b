//! A request's conversation as a list of block digests, gathered while the
//! skim (`request_view/skim.rs`) walks the body, so the body is read once.
//!
//! A block is one element of a conversation member (a message, a
//! Responses item, a tool, a system block), or a [`CHUNK_BYTES`] slice of
//! a long string inside one: a string that grows in place (a completion
//! prompt, a message streamed into) keeps the digests of its full chunks,
//! so its chain extends the earlier one.
//!
//! Tokenizer-free and bounded: a string is not hashed whole but by
//! samples (its length, and [`WINDOW`] bytes at its start, its thirds and
//! its end, per chunk), a few dozen instructions per block whatever its
//! size. An edit inside a long chunk that keeps its length and misses the
//! windows goes unseen; the cost of that is a placement hint, never a
//! wrong answer, since the engine's own cache decides what it reuses.
//! What moves from turn to turn without changing the conversation is left
//! out: `cache_control` (Anthropic clients move their breakpoints every
//! turn) and the keys' names.

use bytes::Bytes;
use xxhash_rust::xxh3::xxh3_64;

/// Raw string bytes per chunk block: about a thousand tokens.
pub const CHUNK_BYTES: usize = 4096;
/// Bytes read at each sample point of a string or chunk.
const WINDOW: usize = 16;
/// Strings up to this long are read whole.
const WHOLE: usize = 4 * WINDOW;

/// Where a member's blocks go in the chain: the prompt's order as engines
/// render it (tools and the system text first), whatever order the
/// client wrote the members in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Member {
    Tools = 0,
    System = 1,
    Turns = 2,
}

impl Member {
    /// The conversation member a top-level key names, for any API.
    pub fn of_key(key: &[u8]) -> Option<Member> {
        match key {
            b"tools" => Some(Member::Tools),
            b"system" | b"instructions" => Some(Member::System),
            b"messages" | b"input" | b"prompt" => Some(Member::Turns),
            _ => None,
        }
    }
}

/// One block: its digest (unkeyed; the index keys it) and whether it is
/// the model's own output (an assistant message, a Responses
/// `function_call` or `reasoning` item), which is what a conversation's
/// next turn adds after the request it continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub digest: u64,
    pub assistant: bool,
    /// The model's output asked for tools (an OpenAI `tool_calls`, an
    /// Anthropic `tool_use` block, a Responses `function_call`): its own
    /// conversation goes on with their results.
    pub calls_tool: bool,
    /// Tools' results (a `tool` message, an Anthropic `tool_result`
    /// block, a Responses `function_call_output`).
    pub tool_result: bool,
    /// A chunk of a string that went on past it (not the end of its element).
    pub chunk: bool,
    /// The string bytes the block covers (of a chunk, the chunk's; of an
    /// element's last block, what its strings held after their full
    /// chunks): how long a prefix of blocks is, roughly, in tokens.
    pub bytes: u32,
    /// The chain value of the blocks up to this one, in prompt order: what
    /// the index keys the prefix ending here by (set by
    /// [`BlockSink::finish`], as `ContentIndex::chain` computes it).
    pub chain: u64,
}

/// Where every chain starts.
pub(super) const CHAIN_SEED: u64 = 0x243f_6a88_85a3_08d3;

/// The body the skim reads, for the samples: its pieces and where each
/// starts. Piece 0 is `first`, piece `i` is `rest[i - 1]`.
pub struct Source<'a> {
    first: &'a [u8],
    rest: &'a [Bytes],
    /// Where each piece of `rest` starts in the body; empty for a body of
    /// one piece (most bodies), which then costs no allocation.
    starts: Vec<usize>,
    /// The piece the last sample was in: samples come in body order, so
    /// the next is nearly always there or in the next one.
    last: std::cell::Cell<usize>,
}

impl<'a> Source<'a> {
    pub fn new(first: &'a [u8], rest: &'a [Bytes]) -> Self {
        let mut at = first.len();
        let starts = rest
            .iter()
            .map(|piece| {
                let start = at;
                at += piece.len();
                start
            })
            .collect();
        Source {
            first,
            rest,
            starts,
            last: std::cell::Cell::new(0),
        }
    }

    /// Piece `i` and where it starts.
    fn piece(&self, i: usize) -> Option<(usize, &'a [u8])> {
        match i.checked_sub(1) {
            None => Some((0, self.first)),
            Some(r) => Some((*self.starts.get(r)?, &self.rest.get(r)?[..])),
        }
    }

    /// The piece holding byte `at` (the last piece past the end).
    fn piece_at(&self, at: usize) -> usize {
        self.starts.partition_point(|&start| start <= at)
    }

    /// The bytes `start..end` when one piece holds them all (the rule).
    fn slice(&self, start: usize, end: usize) -> Option<&'a [u8]> {
        if end <= self.first.len() {
            return self.first.get(start..end);
        }
        let hint = self.last.get();
        for i in [hint, hint + 1] {
            let (at, piece) = self.piece(i)?;
            if start >= at && end <= at + piece.len() {
                self.last.set(i);
                return piece.get(start - at..end - at);
            }
        }
        let i = self.piece_at(start);
        let (at, piece) = self.piece(i)?;
        self.last.set(i);
        piece.get(start.checked_sub(at)?..end.checked_sub(at)?)
    }

    /// The absolute offset of `at` in piece `piece`.
    pub fn offset(&self, piece: usize, at: usize) -> usize {
        self.piece(piece).map_or(0, |(start, _)| start + at)
    }

    /// Copies the bytes from `from` into `out` (fewer at the body's end).
    fn copy(&self, from: usize, out: &mut [u8]) -> usize {
        let mut written = 0;
        let mut i = self.piece_at(from);
        while let Some((start, piece)) = self.piece(i) {
            if written == out.len() {
                break;
            }
            i += 1;
            let skip = (from + written).saturating_sub(start);
            let Some(bytes) = piece.get(skip..) else {
                continue;
            };
            let n = bytes.len().min(out.len() - written);
            out[written..written + n].copy_from_slice(&bytes[..n]);
            written += n;
        }
        written
    }
}

/// Collects the blocks of one body as the skim walks it.
#[derive(Default)]
pub struct BlockSink {
    members: [Vec<Block>; 3],
    /// The element being read: its member, running digest, first block.
    current: Option<(Member, u64, usize)>,
    assistant: bool,
    calls_tool: bool,
    tool_result: bool,
    /// String bytes of the current element not yet in a block.
    pending_bytes: usize,
    /// Blocks so far, of every member.
    count: usize,
}

/// Blocks a request contributes at most (4 MiB of prompt in chunks).
pub const MAX_BLOCKS: usize = 1024;

impl BlockSink {
    /// An element of `member` starts (a message; or a whole string member).
    pub fn begin(&mut self, member: Member) {
        let first = self.members[member as usize].len();
        self.current = Some((member, 0x9e37_79b9_7f4a_7c15, first));
        self.pending_bytes = 0;
        self.assistant = false;
        self.calls_tool = false;
        self.tool_result = false;
    }

    /// A string of the current element, from `start` to `end` (absolute
    /// offsets of its raw bytes, quotes excluded); long ones close a block
    /// per full chunk.
    pub fn string(&mut self, src: &Source, start: usize, end: usize) {
        let Some((member, mut digest, first)) = self.current else {
            return;
        };
        let mut at = start;
        while end - at > CHUNK_BYTES {
            digest = fold(digest, sample(src, at, at + CHUNK_BYTES));
            self.push(member, digest, true, CHUNK_BYTES);
            at += CHUNK_BYTES;
        }
        digest = fold(digest, sample(src, at, end));
        self.pending_bytes += end - at;
        self.current = Some((member, digest, first));
    }

    /// A role or item type of the current element: the model's own output?
    /// Tool calls, tool results?
    pub fn kind(&mut self, value: &[u8]) {
        let call = value.ends_with(b"_call");
        self.assistant |= matches!(value, b"assistant" | b"reasoning") || call;
        self.calls_tool |= call;
        self.tool_result |= matches!(value, b"tool" | b"function_call_output");
    }

    /// The type of a content block inside the current element (Anthropic's
    /// `tool_use` and `tool_result` say what the message carries).
    pub fn block_kind(&mut self, value: &[u8]) {
        self.calls_tool |= value == b"tool_use";
        self.tool_result |= value == b"tool_result";
    }

    /// The current element holds OpenAI chat `tool_calls`.
    pub fn calls_tool(&mut self) {
        self.calls_tool = true;
    }

    /// The current element ends: its last block, and every block of it
    /// marked with what its role said.
    pub fn end(&mut self) {
        let Some((member, digest, first)) = self.current.take() else {
            return;
        };
        let bytes = std::mem::take(&mut self.pending_bytes);
        self.push(member, fold(digest, 0x5a), false, bytes);
        for b in self.members[member as usize].iter_mut().skip(first) {
            b.assistant = self.assistant;
            b.calls_tool = self.calls_tool;
            b.tool_result = self.tool_result;
        }
    }

    /// Adds a block unless the cap is reached: past it the rest of the
    /// body adds none (work and memory per request stay bounded).
    fn push(&mut self, member: Member, digest: u64, chunk: bool, bytes: usize) {
        if self.count >= MAX_BLOCKS {
            return;
        }
        self.count += 1;
        self.members[member as usize].push(Block {
            digest,
            assistant: false,
            calls_tool: false,
            tool_result: false,
            chunk,
            bytes: u32::try_from(bytes).unwrap_or(u32::MAX),
            chain: 0,
        });
    }

    /// The blocks in prompt order, each with its chain value. Most bodies
    /// have one member (their messages), whose blocks are then handed over
    /// as they are, without a copy into a new vector.
    pub fn finish(self) -> Vec<Block> {
        let mut out: Vec<Block> = Vec::new();
        for member in self.members {
            if out.is_empty() {
                out = member;
            } else {
                out.extend(member);
            }
        }
        let mut at = CHAIN_SEED;
        for b in &mut out {
            at = crate::hash::mix64(at, b.digest);
            b.chain = at;
        }
        out
    }
}

fn fold(digest: u64, sample: u64) -> u64 {
    crate::hash::mix64(digest, sample)
}

/// The digest of the raw bytes `start..end` by their samples.
fn sample(src: &Source, start: usize, end: usize) -> u64 {
    let len = end.saturating_sub(start);
    if let Some(bytes) = src.slice(start, end) {
        return sample_slice(bytes);
    }
    // Cut by a piece boundary: the samples gathered into one buffer first.
    let mut buf = [0u8; WHOLE + 8];
    buf[..8].copy_from_slice(&(len as u64).to_le_bytes());
    let n = if len <= WHOLE {
        src.copy(start, &mut buf[8..8 + len])
    } else {
        let points = [start, start + len / 3, start + 2 * len / 3, end - WINDOW];
        let mut n = 0;
        for p in points {
            n += src.copy(p, &mut buf[8 + n..8 + n + WINDOW]);
        }
        n
    };
    xxh3_64(&buf[..8 + n])
}

/// [`sample`] of bytes one piece holds: the same digest, without the
/// copies for a short string.
fn sample_slice(bytes: &[u8]) -> u64 {
    let len = bytes.len();
    let mut buf = [0u8; WHOLE + 8];
    buf[..8].copy_from_slice(&(len as u64).to_le_bytes());
    if len <= WHOLE {
        buf[8..8 + len].copy_from_slice(bytes);
        return xxh3_64(&buf[..8 + len]);
    }
    let points = [0, len / 3, 2 * len / 3, len - WINDOW];
    for (i, p) in points.into_iter().enumerate() {
        buf[8 + i * WINDOW..8 + (i + 1) * WINDOW].copy_from_slice(&bytes[p..p + WINDOW]);
    }
    xxh3_64(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(text: &str) -> Vec<Block> {
        let src = Source::new(text.as_bytes(), &[]);
        let mut sink = BlockSink::default();
        sink.begin(Member::Turns);
        sink.string(&src, 0, text.len());
        sink.end();
        sink.finish()
    }

    #[test]
    fn a_growing_string_keeps_its_full_chunks() {
        let short = "a".repeat(CHUNK_BYTES * 2 + 10);
        let long = format!("{short}{}", "b".repeat(CHUNK_BYTES));
        let (s, l) = (digest_of(&short), digest_of(&long));
        assert_eq!(s.len(), 3);
        assert_eq!(l.len(), 4);
        assert_eq!(s[..2], l[..2]);
        assert_ne!(s[2], l[2]);
        assert!(s[0].chunk && !s[2].chunk);
    }

    #[test]
    fn samples_read_across_pieces() {
        let text = "0123456789".repeat(1000);
        let whole = digest_of(&text);
        let bytes = Bytes::from(text.clone().into_bytes());
        let rest = [bytes.slice(17..5000), bytes.slice(5000..)];
        let src = Source::new(&bytes[..17], &rest);
        let mut sink = BlockSink::default();
        sink.begin(Member::Turns);
        sink.string(&src, 0, text.len());
        sink.end();
        assert_eq!(sink.finish(), whole);
    }

    #[test]
    fn members_in_prompt_order_and_roles_marked() {
        let text = "system text, then a message";
        let src = Source::new(text.as_bytes(), &[]);
        let mut sink = BlockSink::default();
        sink.begin(Member::Turns);
        sink.kind(b"assistant");
        sink.string(&src, 18, text.len());
        sink.end();
        sink.begin(Member::System);
        sink.string(&src, 0, 11);
        sink.end();
        let blocks = sink.finish();
        assert_eq!(blocks.len(), 2);
        assert!(!blocks[0].assistant && blocks[1].assistant);
        assert_eq!(blocks[0], digest_of("system text")[0]);
    }

    #[test]
    fn kinds() {
        let mut sink = BlockSink::default();
        for (kind, assistant) in [
            (&b"user"[..], false),
            (b"function_call_output", false),
            (b"message", false),
            (b"function_call", true),
            (b"reasoning", true),
        ] {
            sink.begin(Member::Turns);
            sink.kind(kind);
            assert_eq!(sink.assistant, assistant, "{kind:?}");
        }
    }
}
