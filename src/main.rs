//! `llm-gateway`: wiring only. The binary's own modules (`cli`, `demo`) are
//! the only code that may use the simulator and bench crates; the library
//! (the gateway itself) never does.

mod cli;
mod demo;

use clap::Parser;
use cli::{Cli, Command};
use std::process::ExitCode;

// The process's allocator: mimalloc, in place of glibc's malloc. A request
// makes about a hundred small allocations; glibc's per-thread cache keeps
// at most 7 freed blocks of a size, so most took its slow path, and with
// mimalloc the gateway counts 12 % fewer instructions on a small request
// (`benches/instructions.sh`). mimalloc also keeps freed pages for 1 s, so a
// steady flow of long prompts stops faulting its body pieces in again
// (`benches/body_wallclock.sh`). `no_thp` (Cargo.toml): with transparent huge
// pages its arenas grew in 2 MiB steps (`benches/scale_streams.sh`).
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
        #[cfg(feature = "bench")]
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
