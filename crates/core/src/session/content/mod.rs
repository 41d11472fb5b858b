//! Conversations recognised by their content, for requests that name no
//! session: the request's blocks ([`blocks`], gathered by the skim) chained
//! and matched against the route's index of earlier requests ([`index`]).
//! The idea is llm-d's session-granularity prefix affinity (a chain of
//! hashes over message blocks, tokenizer-free); the template rule and the
//! fork rule are this gateway's.

pub mod blocks;
pub mod index;

pub use blocks::{Block, BlockSink, Member, Source};
pub use index::{ContentConfig, ContentIndex, Holder, How, Recognised, Template};

/// The blocks of a body in pieces, read as the gateway reads it: in its
/// pieces, else joined (a member cut by a boundary).
pub fn blocks_of(pieces: &[bytes::Bytes]) -> Vec<Block> {
    use crate::request_view::RequestView;
    let mut sink = BlockSink::default();
    if RequestView::parse_pieces_into(pieces, Some(&mut sink)).is_some() {
        return sink.finish();
    }
    let whole = pieces.concat();
    let mut sink = BlockSink::default();
    match RequestView::parse_into(&whole, Some(&mut sink)) {
        Ok(_) => sink.finish(),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
