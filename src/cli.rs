//! Command-line parsing and the top-level commands (serve, check, demo).

use crate::admin::AdminApp;
use crate::config::{self, GatewayConfig, Overrides};
use crate::controller::{log_reload, Controller};
use crate::proxy::Gateway;
use crate::registry::Registry;
use pingora::apps::http_app::HttpServer;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

pub const USAGE: &str = "\
usage:
  llm-gateway [serve] [--config FILE] [--listen ADDR] [--admin-listen ADDR] [--routes DIR]
  llm-gateway check   [--config FILE] [--routes DIR]
  llm-gateway sim     --engines N --port PORT [--realistic]
  llm-gateway demo    [--listen ADDR] [--admin-listen ADDR]
  llm-gateway bench   [--help]   replay agent sessions through every placement mode

--config defaults to conf/gateway.yaml when that file exists.
Signals: SIGHUP re-reads routes/ (no restart), SIGTERM drains and exits.";

#[derive(Debug, Default, Clone)]
pub struct Options {
    pub config: Option<PathBuf>,
    pub overrides: Overrides,
}

#[derive(Debug)]
pub enum Command {
    Serve(Options),
    Check(Options),
    Sim(Vec<String>),
    Bench(Vec<String>),
    Demo(Options),
    Help,
}

pub fn parse(args: &[String]) -> Result<Command, String> {
    let (cmd, rest) = match args.first().map(String::as_str) {
        Some("serve") => ("serve", &args[1..]),
        Some("check") => ("check", &args[1..]),
        Some("demo") => ("demo", &args[1..]),
        Some("sim") => return Ok(Command::Sim(args[1..].to_vec())),
        Some("bench") => return Ok(Command::Bench(args[1..].to_vec())),
        Some("help" | "-h" | "--help") => return Ok(Command::Help),
        _ => ("serve", args),
    };
    let mut opts = Options::default();
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--config" | "-c" => opts.config = Some(PathBuf::from(value()?)),
            "--listen" => opts.overrides.listen = Some(value()?),
            "--admin-listen" => opts.overrides.admin_listen = Some(value()?),
            "--routes" => opts.overrides.routes_dir = Some(PathBuf::from(value()?)),
            "-h" | "--help" => return Ok(Command::Help),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(match cmd {
        "check" => Command::Check(opts),
        "demo" => Command::Demo(opts),
        _ => Command::Serve(opts),
    })
}

fn load_gateway(opts: &Options) -> Result<GatewayConfig, config::ConfigError> {
    let default = PathBuf::from("conf/gateway.yaml");
    match &opts.config {
        Some(path) => GatewayConfig::load(path, &opts.overrides),
        None if default.exists() => GatewayConfig::load(&default, &opts.overrides),
        None => GatewayConfig::parse(&PathBuf::from("<defaults>"), "", &opts.overrides),
    }
}

/// Validates gateway.yaml and every route file; the first error wins.
pub fn check(opts: Options) -> ExitCode {
    let gateway = match load_gateway(&opts) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let routes = match config::load_routes_dir(&gateway.routes_dir, &gateway) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (name, result) in &routes {
        match result {
            Ok(route) => {
                for w in &route.warnings {
                    eprintln!("warning: {}: {w}", route.file.display());
                }
                println!("ok: route {name} ({} peers)", route.peers.len());
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "config ok: {} route(s) in {}",
        routes.len(),
        gateway.routes_dir.display()
    );
    ExitCode::SUCCESS
}

pub fn serve(opts: Options) -> ExitCode {
    match load_gateway(&opts) {
        Ok(gateway) => run(gateway),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Builds the Pingora server and runs it until shutdown.
pub fn run(gateway: GatewayConfig) -> ExitCode {
    let registry = Arc::new(Registry::new(gateway.clone()));
    log_reload(&registry.reload());

    let conf = ServerConf {
        threads: gateway.threads,
        grace_period_seconds: Some(gateway.grace_period.as_secs()),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let mut proxy = pingora::proxy::http_proxy_service_with_name(
        &server.configuration,
        Gateway::new(Arc::clone(&registry)),
        "llm-gateway",
    );
    proxy.add_tcp(&gateway.listen.to_string());

    let mut admin = Service::new(
        "admin".to_string(),
        HttpServer::new_app(AdminApp::new(Arc::clone(&registry))),
    );
    admin.threads = Some(1);
    admin.add_tcp(&gateway.admin_listen.to_string());

    let controller = background_service(
        "controller",
        Controller::new(Arc::clone(&registry), gateway.grace_period),
    );

    log::info!(
        "llm-gateway listening on {} (admin {}), routes from {}",
        gateway.listen,
        gateway.admin_listen,
        gateway.routes_dir.display()
    );
    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(controller);
    server.run_forever()
}

/// Simulated engines in-process plus the gateway with a demo route on them.
pub fn demo(opts: Options) -> ExitCode {
    crate::demo::run(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_commands_and_flags() {
        match parse(&args("--config c.yaml --listen 127.0.0.1:1")).unwrap() {
            Command::Serve(o) => {
                assert_eq!(o.config, Some(PathBuf::from("c.yaml")));
                assert_eq!(o.overrides.listen.as_deref(), Some("127.0.0.1:1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&args("check --routes r")).unwrap(),
            Command::Check(_)
        ));
        assert!(
            matches!(parse(&args("sim --engines 3")).unwrap(), Command::Sim(a) if a.len() == 2)
        );
        assert!(parse(&args("--listen")).is_err());
        assert!(parse(&args("--bogus")).is_err());
    }
}
