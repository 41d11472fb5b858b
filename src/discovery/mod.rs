//! Where a route's peers come from when something other than its route file names them.

pub mod kubernetes;
