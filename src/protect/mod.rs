//! The protection layer's pure cores (issue 9): the adaptive concurrency
//! step. Clock-injected and free of I/O, like `placement`; the proxy wires
//! them in through `proxy/guards` and `balance`.

pub mod aimd;
