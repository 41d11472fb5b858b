//! `llm-gateway`: wiring only. The binary's own modules (`cli`, `demo`) are
//! the only code that may use the simulator and bench crates; the library
//! (the gateway itself) never does.

mod cli;
mod demo;

use clap::Parser;
use cli::{Cli, Command};
use std::process::ExitCode;

// The process's allocator: mimalloc, in place of glibc's malloc.
//
// A request makes about a hundred allocations (Pingora's and the
// gateway's), most of them small and freed within the request. glibc's
// per-thread cache keeps at most 7 freed blocks of a size, none over
// 1 KiB; past that each allocation takes the allocator's slower path
// (bins, consolidation). Counted by callgrind (`benches/instructions.sh`,
// `--separate-callers`), that slow path cost 13.4 k instructions per
// 20-frame stream in the gateway against 6.8 k in bare Pingora, for about
// as many allocations a frame (5.3 against 5.0). mimalloc's free
// lists are per page and unbounded: with it the gateway counts 12 % fewer
// instructions on a small request, 6 % on a 20-frame stream, 4 % on a
// 300 KB body (BENCHMARKS.md, issue 13, stop 25).
//
// Long prompts: a body is kept in the pieces it was read in, 64 KiB each
// (`proxy/request/pieces.rs`). glibc gave the freed pieces back to the
// kernel after every request, and the next long prompt faulted them in
// again (16 faults for a 300 KB body); `src/heap.rs` used to raise glibc's
// trim and mmap thresholds against that. mimalloc returns a page only
// after it has gone unused for its `purge_delay` (1 s by default), so a
// steady flow of long prompts reuses the same pages (0.0 faults a
// request in `benches/body_wallclock.sh`), and an idle gateway still
// gives them back. Built without transparent huge pages (`no_thp`,
// Cargo.toml): with them its arenas grew in 2 MiB steps, and 5,000 open
// streams held 3.4x the memory (`benches/scale_streams.sh`).
//
// Declared here, in the binary, not in the library: a test binary may
// set its own (`tests/body_memory.rs` counts allocations through one).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    llm_gateway::logging::init();
    let cli = Cli::parse();
    match cli.command {
        None => serve(&cli.serve),
        Some(Command::Serve(args)) => serve(&args),
        Some(Command::Check(args)) => {
            let overrides = llm_gateway::config::Overrides {
                routes_dir: args.routes.clone(),
                ..Default::default()
            };
            llm_gateway::server::check(args.config.as_deref(), &overrides)
        }
        Some(Command::Sim(args)) => exit_code(llm_gateway_sim::run(args)),
        Some(Command::Demo(args)) => demo::run(args),
        Some(Command::Bench(args)) => exit_code(llm_gateway_bench::run(*args)),
        Some(Command::BodylogListen(args)) => {
            exit_code(llm_gateway::bodylog::listen::run(args.config()))
        }
    }
}

fn serve(args: &cli::ServeArgs) -> ExitCode {
    match llm_gateway::server::load_gateway(args.config.as_deref(), &args.overrides()) {
        Ok(gateway) => llm_gateway::server::run(gateway),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(code.clamp(0, 255) as u8)
}
