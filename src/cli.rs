//! The command line (binary only): one clap definition for every subcommand,
//! so `--help` and the README's command table come from the same place.

use clap::{Args, Parser, Subcommand};
use llm_gateway::config::Overrides;
use std::path::PathBuf;

/// Session-affine, load-aware inference gateway for OpenAI-compatible engines.
///
/// Signals: SIGHUP re-reads routes/ and the key files (no restart; with
/// `watch: true`, the default, a change to them does the same), SIGTERM
/// drains and exits.
#[derive(Debug, Parser)]
#[command(name = "llm-gateway", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `llm-gateway [flags]` is `llm-gateway serve [flags]`.
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve (the default when no subcommand is given).
    Serve(ServeArgs),
    /// Validate gateway.yaml and every route file offline; exits non-zero
    /// with `file:line: reason` on the first error.
    Check(CheckArgs),
    /// Run simulated OpenAI-compatible engines only.
    Sim(llm_gateway_sim::SimArgs),
    /// Simulated engines in-process plus the gateway with a `demo` route.
    Demo(DemoArgs),
    // No doc comment: it would replace the bench's own long help (what
    // `bench --help` explains: cells, routers, peers, exit codes).
    #[cfg(feature = "bench")]
    Bench(Box<llm_gateway_bench::BenchArgs>),
    /// Receive the gateway's body-log frames: hourly JSONL files in --dir
    /// and, with --metrics, the exporter's /metrics.
    BodylogListen(BodylogListenArgs),
}

#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// gateway.yaml to read [default: conf/gateway.yaml when it exists]
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address of the main listener (overrides `listen`)
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Address of the admin listener (overrides `admin_listen`)
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Directory of route files (overrides `routes_dir`)
    #[arg(long, value_name = "DIR")]
    pub routes: Option<PathBuf>,
}

impl ServeArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            admin_listen: self.admin_listen.clone(),
            routes_dir: self.routes.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, Args)]
pub struct CheckArgs {
    /// gateway.yaml to read [default: conf/gateway.yaml when it exists]
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory of route files (overrides `routes_dir`)
    #[arg(long, value_name = "DIR")]
    pub routes: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct BodylogListenArgs {
    /// Address to receive frames on
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9999")]
    pub listen: String,
    /// Directory of the hourly files (YYYYMMDD-HH.jsonl, UTC hours)
    #[arg(long, value_name = "DIR", default_value = "/var/log/llm-gateway")]
    pub dir: PathBuf,
    /// Address to serve the exporter's /metrics on [default: none]
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
}

impl BodylogListenArgs {
    pub fn config(&self) -> llm_gateway::bodylog::listen::ListenConfig {
        llm_gateway::bodylog::listen::ListenConfig {
            listen: self.listen.clone(),
            dir: self.dir.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, Args)]
pub struct DemoArgs {
    /// Address of the main listener
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Address of the admin listener
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8090")]
    pub admin_listen: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(line: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("llm-gateway").chain(line.split_whitespace()))
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_commands_and_flags() {
        let cli = parse("--config c.yaml --listen 127.0.0.1:1").unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.config, Some(PathBuf::from("c.yaml")));
        assert_eq!(cli.serve.listen.as_deref(), Some("127.0.0.1:1"));
        assert!(matches!(
            parse("check --routes r").unwrap().command,
            Some(Command::Check(_))
        ));
        assert!(matches!(
            parse("sim --engines 3").unwrap().command,
            Some(Command::Sim(_))
        ));
        let listen = parse("bodylog-listen --dir /tmp/x --metrics 127.0.0.1:1").unwrap();
        let Some(Command::BodylogListen(args)) = listen.command else {
            panic!("bodylog-listen parsed as {:?}", listen.command);
        };
        assert_eq!(args.listen, "0.0.0.0:9999");
        assert_eq!(args.metrics.as_deref(), Some("127.0.0.1:1"));
        assert!(parse("--listen").is_err());
        assert!(parse("--bogus").is_err());
    }
}
