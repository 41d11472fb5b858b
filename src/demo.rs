//! `llm-gateway demo`: three simulated engines in-process and the gateway in
//! front of them with a `demo` route, so a newcomer can watch sessions stick
//! and cached tokens grow without a GPU.

use crate::cli::DemoArgs;
use llm_gateway::config::{GatewayConfig, Overrides};
use llm_gateway_sim::{spawn_engines, EngineConfig};
use std::path::PathBuf;
use std::process::ExitCode;

pub fn run(args: DemoArgs) -> ExitCode {
    let cluster = match spawn_engines(3, 0, EngineConfig::realistic()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("demo: cannot start simulated engines: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = std::env::temp_dir().join(format!("llm-gateway-demo-{}", std::process::id()));
    let routes = dir.join("routes");
    if let Err(e) = std::fs::create_dir_all(&routes) {
        eprintln!("demo: cannot create {}: {e}", routes.display());
        return ExitCode::FAILURE;
    }
    let mut route =
        String::from("# Demo route on simulated engines (see `llm-gateway sim`).\npeers:\n");
    for (i, engine) in cluster.engines.iter().enumerate() {
        route.push_str(&format!(
            "  - {{name: engine-{i}, host: 127.0.0.1, port: {}, max_concurrency: 32}}\n",
            engine.port()
        ));
    }
    route.push_str("balancing:\n  mode: load_aware\nhealth:\n  interval: 1s\n");
    if let Err(e) = std::fs::write(routes.join("demo.yaml"), route) {
        eprintln!("demo: cannot write the demo route: {e}");
        return ExitCode::FAILURE;
    }
    let overrides = Overrides {
        listen: Some(args.listen),
        admin_listen: Some(args.admin_listen),
        routes_dir: Some(routes.clone()),
    };
    let mut gateway = match GatewayConfig::parse(&PathBuf::from("<demo>"), "", &overrides) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The demo runs without API keys: their absence is the demo's
    // normal state, not the fault it would be in a deployment.
    gateway.key_file_expected = false;
    let url = format!("http://{}/demo/v1/chat/completions", gateway.listen);
    println!(
        "\nllm-gateway demo: 3 simulated engines behind {url}\n\
         route file: {}/demo.yaml (edit it and `kill -HUP {}` to reload)\n\n\
         Send the same session twice and watch x-routed-peer stay put and cached_tokens grow:\n\n  \
         curl -sN {url} -H 'content-type: application/json' -H 'x-session-id: demo-1' -D - \\\n    \
         -d '{{\"model\":\"sim-model\",\"stream\":true,\"stream_options\":{{\"include_usage\":true}},\"messages\":[{{\"role\":\"user\",\"content\":\"Tell me a long story about a gateway that remembers where every conversation lives.\"}}]}}'\n\n\
         Metrics: curl -s http://{}/metrics | grep llm_gateway_\n",
        routes.display(),
        std::process::id(),
        gateway.admin_listen
    );
    // The engines live as long as the process; keep the cluster alive.
    let code = llm_gateway::server::run(gateway);
    drop(cluster);
    code
}
