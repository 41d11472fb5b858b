//! `llm-gateway sim`: standalone simulated engines for manual runs and docker.

use std::io::Write;

use super::{start_engine, EngineConfig};

const USAGE: &str = "\
usage: llm-gateway sim [--engines N] [--port P] [--host ADDR] [--model NAME]
                       [--max-running N] [--realistic]

Runs N simulated OpenAI-compatible engines on ports P, P+1, ... until killed.
  --engines N      number of engines (default 1)
  --port P         first port; 0 picks free ports (default 9001)
  --host ADDR      address to listen on (default 127.0.0.1)
  --model NAME     model name served (default sim-model)
  --max-running N  sequences decoded at once per engine
  --realistic      vLLM-like timings (slower) instead of the fast test defaults";

#[derive(Debug)]
struct Options {
    engines: usize,
    port: u16,
    host: String,
    cfg: EngineConfig,
}

/// `Ok(None)` means help was asked for.
fn parse(args: &[String]) -> Result<Option<Options>, String> {
    // Callers pass the arguments after the subcommand; tolerate the
    // subcommand itself being included.
    let args = match args.first() {
        Some(first) if first == "sim" => &args[1..],
        _ => args,
    };
    let mut engines = 1usize;
    let mut port = 9001u16;
    let mut host = "127.0.0.1".to_string();
    let mut model = None;
    let mut max_running = None;
    let mut realistic = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag {
            "-h" | "--help" => return Ok(None),
            "--realistic" if inline.is_none() => realistic = true,
            "--engines" => {
                engines = value(flag)?
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or("--engines must be a positive integer")?
            }
            "--port" => port = value(flag)?.parse().map_err(|_| "--port must be 0-65535")?,
            "--host" => host = value(flag)?,
            "--model" => model = Some(value(flag)?).filter(|m| !m.is_empty()),
            "--max-running" => {
                max_running = Some(
                    value(flag)?
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or("--max-running must be a positive integer")?,
                )
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    if port != 0 && usize::from(port) + engines - 1 > usize::from(u16::MAX) {
        return Err(format!(
            "{engines} engines from port {port} run past port 65535"
        ));
    }
    let mut cfg = if realistic {
        EngineConfig::realistic()
    } else {
        EngineConfig::default()
    };
    if let Some(model) = model {
        cfg.name = model;
    }
    if let Some(n) = max_running {
        cfg.max_running = n;
    }
    Ok(Some(Options {
        engines,
        port,
        host,
        cfg,
    }))
}

/// Runs `llm-gateway sim` with the arguments after the subcommand. Returns
/// the process exit code: 2 for bad arguments, 1 if an engine cannot start,
/// 0 after Ctrl-C.
pub fn run_cli(args: &[String]) -> i32 {
    let opts = match parse(args) {
        Ok(Some(opts)) => opts,
        Ok(None) => {
            println!("{USAGE}");
            return 0;
        }
        Err(message) => {
            eprintln!("llm-gateway sim: {message}\n\n{USAGE}");
            return 2;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("llm-gateway sim: cannot start the runtime: {e}");
            return 1;
        }
    };
    rt.block_on(async move {
        let mut engines = Vec::with_capacity(opts.engines);
        for i in 0..opts.engines {
            // Checked in `parse` not to overflow.
            let port = if opts.port == 0 {
                0
            } else {
                opts.port + i as u16
            };
            let listener = match tokio::net::TcpListener::bind((opts.host.as_str(), port)).await {
                Ok(l) => l,
                Err(e) => {
                    eprintln!(
                        "llm-gateway sim: cannot listen on {}:{port}: {e}",
                        opts.host
                    );
                    return 1;
                }
            };
            match start_engine(listener, opts.cfg.clone()).await {
                Ok(engine) => engines.push(engine),
                Err(e) => {
                    eprintln!("llm-gateway sim: cannot start engine {i}: {e}");
                    return 1;
                }
            }
        }
        let mut out = std::io::stdout().lock();
        for (i, engine) in engines.iter().enumerate() {
            let _ = writeln!(
                out,
                "sim engine {i}: {} model={} max_running={}",
                engine.base_url(),
                opts.cfg.name,
                opts.cfg.max_running
            );
        }
        let _ = out.flush();
        drop(out);
        match tokio::signal::ctrl_c().await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("llm-gateway sim: cannot wait for Ctrl-C: {e}");
                1
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_flags_in_both_forms() {
        let o = parse(&args(&[
            "sim",
            "--engines",
            "3",
            "--port=9101",
            "--realistic",
            "--model",
            "m",
        ]))
        .expect("valid")
        .expect("not help");
        assert_eq!((o.engines, o.port, o.cfg.name.as_str()), (3, 9101, "m"));
        assert_eq!(
            o.cfg.decode_ms_per_token,
            EngineConfig::realistic().decode_ms_per_token
        );
    }

    #[test]
    fn bad_arguments_exit_2() {
        assert_eq!(run_cli(&args(&["--engines", "zero"])), 2);
        assert_eq!(run_cli(&args(&["--engines", "0"])), 2);
        assert_eq!(run_cli(&args(&["--port"])), 2);
        assert_eq!(run_cli(&args(&["--bogus"])), 2);
        assert_eq!(run_cli(&args(&["--engines", "3", "--port", "65534"])), 2);
        assert_eq!(run_cli(&args(&["--help"])), 0);
    }
}
