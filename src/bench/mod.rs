//! `llm-gateway bench`: replay of agent sessions through the gateway.

/// Entry point of `llm-gateway bench`; returns the process exit code.
pub fn run_cli(_args: &[String]) -> i32 {
    eprintln!("llm-gateway bench: the replay benchmark is being built (src/bench)");
    2
}
