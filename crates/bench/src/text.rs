//! Seeded text in the simulated engine's units: the generator every seeded
//! choice of the bench draws from, the words a user message of tool output
//! or code is made of, and how many bytes the engine counts as a token.

/// Bytes per token, as the simulated engine counts them.
pub const BYTES_PER_TOKEN: usize = 4;
/// The text of one generated token in the simulated engine; a pre-aged
/// history holds replies made of it, as the live ones are.
pub const SIM_TOKEN: &str = "tok ";

/// A small, fast, seedable generator (SplitMix64). Not for anything secret.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    #[cfg(test)]
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// A generator for one item of the workload, derived from the seed and
    /// the item's coordinates, independent of every other item.
    pub fn derive(seed: u64, parts: &[u64]) -> Self {
        let mut state = Rng(seed ^ 0x6c6c_6d2d_6265_6e63);
        for &p in parts {
            state.0 ^= p.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            state.0 = state.next_u64();
        }
        state
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (`lo` when `hi <= lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// Identifiers (`a-z`, `_`, `::`), punctuation and paths: tool output and
/// code as an agent sees them. No quotes or backslashes, so the JSON body
/// has the same bytes as the text.
const WORDS: &[&str] = &[
    "fn",
    "let",
    "mut",
    "self",
    "return",
    "match",
    "Some(x)",
    "None",
    "Ok(())",
    "Err(e)",
    "struct",
    "impl",
    "pub",
    "use",
    "crate::proxy",
    "error[E0308]:",
    "warning:",
    "src/main.rs:42:7",
    "test",
    "passed",
    "FAILED",
    "assert_eq!(a,",
    "b);",
    "=>",
    "{",
    "}",
    "(",
    ")",
    ";",
    "0x1f",
    "1024",
    "async",
    "await?;",
    "tokio::spawn",
    "request",
    "response",
    "config",
    "session",
    "peer",
    "cache",
    "token",
    "let",
    "buf",
    "len",
    "Vec<u8>",
    "String",
    "&str",
    "-> Result<()>",
    "if",
    "else",
    "for",
    "in",
    "while",
    "loop",
    "break",
    "continue",
    "unwrap()",
    "clone()",
    "iter()",
    "map(|x|",
    "x",
    "+",
    "1)",
    "collect()",
    "#[test]",
    "//",
    "TODO",
    "diff",
    "---",
    "+++",
    "@@",
    "-12,7",
    "+12,9",
    "git",
    "cargo",
    "build",
    "Compiling",
    "Finished",
    "running",
    "5",
    "tests",
    "ok",
    "ms",
    "at",
    "line",
    "col",
    "note:",
    "help:",
    "expected",
    "found",
    "type",
    "trait",
    "where",
    "T:",
    "Send",
    "Sync",
    "'static",
    "Arc<Mutex<T>>",
    "parking_lot",
    "bytes::Bytes",
];

/// ASCII text of exactly `bytes` bytes, starting with `header`, in lines of
/// indented words.
pub fn text(rng: &mut Rng, bytes: usize, header: &str) -> String {
    let mut out = String::with_capacity(bytes + 32);
    out.push_str(header);
    out.push('\n');
    while out.len() < bytes {
        let indent = rng.range(0, 3) as usize * 4;
        out.extend(std::iter::repeat_n(' ', indent));
        let words = rng.range(4, 14);
        for i in 0..words {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(WORDS[rng.range(0, WORDS.len() as u64 - 1) as usize]);
        }
        out.push('\n');
    }
    out.truncate(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_range_is_inclusive_and_degenerate_ranges_work() {
        let mut r = Rng::new(1);
        let mut seen = [false; 3];
        for _ in 0..100 {
            seen[(r.range(10, 12) - 10) as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
        assert_eq!(r.range(5, 5), 5);
        assert_eq!(r.range(5, 1), 5);
    }
}
