//! A scenario's cells, in the order they run, and what each puts between
//! the client and the engines: the gateway, nothing (the reference cell),
//! or an external router.

use crate::options::{Options, REFERENCE};
use crate::peers::Found;
use crate::router::RouterSpec;

/// What a cell puts between the client and the engines.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CellKind<'a> {
    /// Nothing: the client places sessions (`reference`).
    Reference,
    /// The gateway, in the mode the cell is named after.
    Gateway,
    /// Another gateway binary in `load_aware` (`--compare`).
    Compare(&'a std::path::Path),
    /// `--router-cmd`.
    Router(&'a RouterSpec),
    /// A peer router of `--peers`.
    Peer(&'a Found),
}

/// One cell of a scenario: its name in the report and what it runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CellSpec<'a> {
    pub name: &'a str,
    pub kind: CellKind<'a>,
}

impl CellKind<'_> {
    /// An external router (a `--router-cmd` or a peer): no gateway
    /// counters, no routed sessions.
    pub fn is_router(self) -> bool {
        matches!(self, CellKind::Router(_) | CellKind::Peer(_))
    }

    /// A gateway process sits between client and engines.
    pub fn is_gateway(self) -> bool {
        matches!(self, CellKind::Gateway | CellKind::Compare(_))
    }
}

/// A scenario's cells in the order they run: `--modes` (or the
/// `--router-cmd` cell in their place), the `--compare` binaries, then the
/// peers found.
pub(crate) fn cells<'a>(opts: &'a Options, peers: &'a [Found]) -> Vec<CellSpec<'a>> {
    let modes = opts.modes.iter().map(|m| CellSpec {
        name: m,
        kind: match &opts.router {
            Some(spec) => CellKind::Router(spec),
            None if m == REFERENCE => CellKind::Reference,
            None => CellKind::Gateway,
        },
    });
    let compared = opts.compare.iter().map(|(label, path)| CellSpec {
        name: label,
        kind: CellKind::Compare(path),
    });
    let peers = peers.iter().map(|f| CellSpec {
        name: f.peer.name,
        kind: CellKind::Peer(f),
    });
    modes.chain(compared).chain(peers).collect()
}
