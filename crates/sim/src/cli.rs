//! `llm-gateway sim`: standalone simulated engines for manual runs and docker.

use std::io::Write;

use super::{start_engine, EngineConfig, Profile};

/// Runs N simulated OpenAI-compatible engines on ports P, P+1, ... until killed.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Number of engines
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub engines: u16,
    /// First port; 0 picks free ports
    #[arg(long, value_name = "P", default_value_t = 9001)]
    pub port: u16,
    /// Address to listen on
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub host: String,
    /// Model name served [default: sim-model]
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Sequences decoded at once per engine
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub max_running: Option<u16>,
    /// vLLM-like timings (slower) instead of the fast test defaults
    #[arg(long)]
    pub realistic: bool,
    /// Engine imitated: slots, vllm, sglang or llamacpp (its scheduler,
    /// /metrics names and endpoints)
    #[arg(long, value_name = "NAME", default_value_t = Profile::Slots)]
    pub profile: Profile,
}

#[derive(Debug)]
struct Options {
    engines: usize,
    port: u16,
    host: String,
    cfg: EngineConfig,
}

impl SimArgs {
    fn resolve(self) -> Result<Options, String> {
        let engines = usize::from(self.engines);
        if self.port != 0 && usize::from(self.port) + engines - 1 > usize::from(u16::MAX) {
            return Err(format!(
                "{engines} engines from port {} run past port 65535",
                self.port
            ));
        }
        let mut cfg = if self.realistic {
            EngineConfig::realistic()
        } else {
            EngineConfig::default()
        };
        if let Some(model) = self.model.filter(|m| !m.is_empty()) {
            cfg.name = model;
        }
        cfg.profile = self.profile;
        if let Some(n) = self.max_running {
            // The batch profiles' batch is max_num_seqs; the others' slots.
            if self.profile.batched() {
                cfg.max_num_seqs = usize::from(n);
            } else {
                cfg.max_running = usize::from(n);
            }
        }
        Ok(Options {
            engines,
            port: self.port,
            host: self.host,
            cfg,
        })
    }
}

/// Runs `llm-gateway sim`. Returns the process exit code: 2 for arguments
/// that do not fit together, 1 if an engine cannot start, 0 after Ctrl-C.
pub fn run(args: SimArgs) -> i32 {
    let opts = match args.resolve() {
        Ok(opts) => opts,
        Err(message) => {
            eprintln!("llm-gateway sim: {message}");
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
                "sim engine {i}: {} model={} profile={} max_running={}",
                engine.base_url(),
                opts.cfg.name,
                opts.cfg.profile,
                if opts.cfg.profile.batched() {
                    opts.cfg.max_num_seqs
                } else {
                    opts.cfg.max_running
                }
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
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimArgs,
    }

    fn parse(v: &[&str]) -> Result<Options, String> {
        Cli::try_parse_from(std::iter::once("sim").chain(v.iter().copied()))
            .map_err(|e| e.to_string())?
            .args
            .resolve()
    }

    #[test]
    fn parses_flags_in_both_forms() {
        let o = parse(&[
            "--engines",
            "3",
            "--port=9101",
            "--realistic",
            "--model",
            "m",
        ])
        .expect("valid");
        assert_eq!((o.engines, o.port, o.cfg.name.as_str()), (3, 9101, "m"));
        assert_eq!(
            o.cfg.decode_ms_per_token,
            EngineConfig::realistic().decode_ms_per_token
        );
        assert_eq!(o.cfg.profile, Profile::Slots);
    }

    #[test]
    fn profile_flag_picks_the_engine_and_what_max_running_means() {
        let o = parse(&["--profile", "vllm", "--max-running", "64"]).expect("valid");
        assert_eq!((o.cfg.profile, o.cfg.max_num_seqs), (Profile::Vllm, 64));
        assert_eq!(o.cfg.max_running, EngineConfig::default().max_running);
        let o = parse(&["--profile=llamacpp", "--max-running", "4"]).expect("valid");
        assert_eq!((o.cfg.profile, o.cfg.max_running), (Profile::Llamacpp, 4));
    }

    #[test]
    fn bad_arguments_are_refused() {
        for bad in [
            &["--engines", "zero"][..],
            &["--engines", "0"],
            &["--port"],
            &["--bogus"],
            &["--engines", "3", "--port", "65534"],
            &["--profile", "tgi"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
