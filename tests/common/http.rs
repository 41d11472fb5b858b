//! The tests' HTTP/1.1 client: the one the bench uses too, in the simulator
//! crate (`llm_gateway_sim::client`), over a blocking socket.

// Each test binary includes `common` and uses a different part of it.
#![allow(unused_imports)]

pub use llm_gateway_sim::client::blocking::*;
pub use llm_gateway_sim::client::{Head, Upload};
