//! `bare_proxy` with the gateway's allocator (mimalloc, `src/main.rs`), so
//! that `benches/instructions.sh` can tell what the allocator saves Pingora
//! itself from what is the gateway's own (target `bare_mimalloc`).

#[path = "bare_proxy.rs"]
mod bare;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    bare::main()
}
