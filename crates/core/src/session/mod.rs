//! Session identity: which conversation a request belongs to.
//!
//! Only a 64-bit stable hash of the client's value is ever kept (see
//! [`extract`]); the per-route session table that remembers where each
//! session runs lives in [`crate::placement`], next to the rules that use it.

pub mod content;
pub mod extract;

pub use extract::{
    extract_session, is_session_header, session_from_body, SessionId, SessionSource,
    MAX_SESSION_VALUE_BYTES,
};
