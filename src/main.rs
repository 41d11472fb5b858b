//! `llm-gateway`: wiring only. Subcommands:
//!   llm-gateway [serve] [--config F] [--listen A] [--admin-listen A] [--routes D]
//!   llm-gateway check   [--config F] [--routes D]
//!   llm-gateway sim     --engines N --port P [--realistic]
//!   llm-gateway demo    [--listen A] [--admin-listen A]

use llm_gateway::cli::{self, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    logger.format_timestamp_millis();
    // Pingora's debug and trace logs print whole request headers, which
    // carry session ids and API keys. Keep them out unless asked for by name.
    if std::env::var_os("LLM_GATEWAY_UNSAFE_PINGORA_DEBUG").is_none() {
        for module in ["pingora_proxy", "pingora_core", "pingora_http"] {
            logger.filter_module(module, log::LevelFilter::Info);
        }
    }
    logger.init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match cli::parse(&args) {
        Ok(Command::Serve(opts)) => cli::serve(opts),
        Ok(Command::Check(opts)) => cli::check(opts),
        Ok(Command::Sim(rest)) => {
            ExitCode::from(llm_gateway::sim::run_cli(&rest).clamp(0, 255) as u8)
        }
        Ok(Command::Demo(opts)) => cli::demo(opts),
        Ok(Command::Bench(rest)) => {
            ExitCode::from(llm_gateway::bench::run_cli(&rest).clamp(0, 255) as u8)
        }
        Ok(Command::Help) => {
            println!("{}", cli::USAGE);
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("llm-gateway: {msg}\n\n{}", cli::USAGE);
            ExitCode::from(2)
        }
    }
}
