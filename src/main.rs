//! `llm-gateway`: wiring only. The binary's own modules (`cli`, `demo`) are
//! the only code that may use the simulator and bench crates; the library
//! (the gateway itself) never does.

mod cli;
mod demo;

use clap::Parser;
use cli::{Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    init_logging();
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

fn init_logging() {
    let mut logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    logger.format_timestamp_millis();
    // Pingora's debug and trace logs print whole request headers, which
    // carry session ids and API keys. Keep them out unless asked for by name.
    let unsafe_debug = std::env::var("LLM_GATEWAY_UNSAFE_PINGORA_DEBUG").ok();
    if !unsafe_debug_wanted(unsafe_debug.as_deref()) {
        for module in ["pingora_proxy", "pingora_core", "pingora_http"] {
            logger.filter_module(module, log::LevelFilter::Info);
        }
    }
    logger.init();
}

/// Only an explicit yes turns the unsafe logs on: `0`, `false` or an empty
/// value must keep them off.
fn unsafe_debug_wanted(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true"))
}

#[cfg(test)]
mod tests {
    use super::unsafe_debug_wanted;

    #[test]
    fn only_one_or_true_turns_the_unsafe_pingora_logs_on() {
        for on in ["1", "true", "TRUE"] {
            assert!(unsafe_debug_wanted(Some(on)), "{on}");
        }
        for off in ["0", "false", "", "no", "yes please"] {
            assert!(!unsafe_debug_wanted(Some(off)), "{off:?}");
        }
        assert!(!unsafe_debug_wanted(None));
    }
}
