//! The protection layer's pure cores: measurement windows and
//! EWMAs (`window`), the adaptive-concurrency step (`aimd`), and session
//! turn priority (`prio`), and which limit a gate holds its EWMA against
//! (`limits`). Clock-injected and free of I/O, like
//! `placement`; the proxy wires them in through `proxy/guards` (the load
//! gates) and `balance` (the adaptive limit).

pub mod aimd;
pub mod gate;
pub mod limits;
pub mod meter;
pub mod prio;
pub mod rolling;
pub mod window;
