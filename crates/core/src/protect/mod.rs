//! The protection layer. `route.rs` is its one owner per route,
//! `RouteProtection`: the state (measurements, counts, adaptive limits,
//! overrides) behind four verbs, judge, count, tick and snapshot.
//! `config.rs` holds the validated settings it applies. The rest are its
//! pure cores: measurement windows and EWMAs (`window`, `meter`), the
//! adaptive-concurrency step (`aimd`), session turn priority (`prio`), probe
//! budgets and gate counts (`gate`), which limit a gate holds its EWMA
//! against (`limits`), and which priority class it refuses first
//! (`classes`). Clock-injected and free of I/O, like `placement`.

pub mod aimd;
pub mod classes;
pub mod config;
pub mod gate;
pub mod limits;
pub mod meter;
pub mod prio;
pub mod rolling;
pub mod route;
pub mod window;
