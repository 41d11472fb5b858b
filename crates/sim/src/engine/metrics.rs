//! `/metrics` and the engine-specific endpoints of the `vllm`, `sglang` and
//! `llamacpp` profiles, each under only its own engine's names, so that a
//! gateway reading them learns what it would learn from that engine. (The
//! `slots` profile's `/metrics` is `Shared::metrics_text`.)

use std::fmt::Write as _;

use serde_json::{json, Value};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::Shared;
use crate::Profile;

type Series = (&'static str, &'static str, &'static str, f64);

fn render(out: &mut String, model: &str, series: &[Series]) {
    for (name, kind, help, value) in series {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{model_name=\"{model}\"}} {value}"
        );
    }
}

impl Shared {
    pub(super) fn vllm_metrics(&self) -> String {
        let Some(batch) = self.batch.as_ref() else {
            return String::new();
        };
        let s = batch.snapshot();
        let c = s.counters;
        let series: [Series; 8] = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                s.running as f64,
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                s.waiting as f64,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                s.kv_usage,
            ),
            (
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                c.prompt_tokens as f64,
            ),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                c.generation_tokens as f64,
            ),
            (
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                c.prefix_queries as f64,
            ),
            (
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                c.prefix_hits as f64,
            ),
            (
                "vllm:num_preemptions_total",
                "counter",
                "Cumulative number of preemption from the engine.",
                c.preemptions as f64,
            ),
        ];
        let mut out = String::with_capacity(2048);
        render(&mut out, &escape_label(&self.cfg.name), &series);
        if !self.cfg.publish_kv_capacity {
            return out;
        }
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1",
            s.block_tokens, s.num_blocks
        );
        out
    }

    pub(super) fn sglang_metrics(&self) -> String {
        let Some(batch) = self.batch.as_ref() else {
            return String::new();
        };
        let s = batch.snapshot();
        let c = s.counters;
        let hit_rate = if c.prefix_queries > 0 {
            c.prefix_hits as f64 / c.prefix_queries as f64
        } else {
            0.0
        };
        let series = [
            (
                "sglang:num_running_reqs",
                "gauge",
                "The number of running requests.",
                s.running as f64,
            ),
            (
                "sglang:num_queue_reqs",
                "gauge",
                "The number of requests in the waiting queue.",
                s.waiting as f64,
            ),
            (
                "sglang:token_usage",
                "gauge",
                "The token usage.",
                s.kv_usage,
            ),
            (
                "sglang:max_total_num_tokens",
                "gauge",
                "Maximum total number of tokens in the KV cache pool.",
                (s.num_blocks * s.block_tokens) as f64,
            ),
            (
                "sglang:cache_hit_rate",
                "gauge",
                "The prefix cache hit rate.",
                hit_rate,
            ),
            (
                "sglang:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                c.prompt_tokens as f64,
            ),
            (
                "sglang:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                c.generation_tokens as f64,
            ),
        ];
        let published = |(name, ..): &&Series| {
            self.cfg.publish_kv_capacity || *name != "sglang:max_total_num_tokens"
        };
        let series: Vec<Series> = series.iter().filter(published).copied().collect();
        let mut out = String::with_capacity(2048);
        render(&mut out, &escape_label(&self.cfg.name), &series);
        out
    }

    /// What every profile's engine did, under the simulator's own names, so
    /// a bench reads tokens and cache hits the same way from each: tokens
    /// generated, prompt tokens asked of the prefix cache, and those it had.
    pub(super) fn sim_counters(&self) -> String {
        let (generated, queried, hits) = match (self.batch.as_ref(), self.llama.as_ref()) {
            (Some(batch), _) => {
                let c = batch.snapshot().counters;
                (c.generation_tokens, c.prefix_queries, c.prefix_hits)
            }
            (None, Some(llama)) => llama.cache_counters(),
            (None, None) => {
                let n =
                    |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::SeqCst);
                (
                    n(&self.generation_tokens_total),
                    n(&self.prefix_cache_queries_total),
                    n(&self.prefix_cache_hits_total),
                )
            }
        };
        let series: [Series; 3] = [
            (
                "sim:generation_tokens_total",
                "counter",
                "Tokens generated.",
                generated as f64,
            ),
            (
                "sim:prefix_cache_queries_total",
                "counter",
                "Prompt tokens looked up in the prefix cache.",
                queried as f64,
            ),
            (
                "sim:prefix_cache_hits_total",
                "counter",
                "Prompt tokens the prefix cache had.",
                hits as f64,
            ),
        ];
        let mut out = String::with_capacity(512);
        render(&mut out, &escape_label(&self.cfg.name), &series);
        out
    }

    pub(super) fn llamacpp_metrics(&self) -> String {
        let Some(llama) = self.llama.as_ref() else {
            return String::new();
        };
        // llama-server's series carry no labels.
        let mut out = String::with_capacity(2048);
        for (name, kind, help, value) in llama.series() {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        out
    }

    /// A `GET` endpoint the profile's engine has and the others do not:
    /// SGLang's server and model info (sglang-router probes them),
    /// llama-server's `/props`.
    pub(super) fn profile_endpoint(&self, path: &str) -> Option<Value> {
        match (self.cfg.profile, path) {
            (Profile::Sglang, "/get_server_info" | "/server_info") => {
                let max_total = self.batch.as_ref().map_or(0, |b| {
                    b.snapshot().num_blocks * self.cfg.block_tokens.max(1)
                });
                Some(json!({
                    "model_path": self.cfg.name,
                    "served_model_name": self.cfg.name,
                    "max_running_requests": self.cfg.max_num_seqs,
                    "chunked_prefill_size": self.cfg.max_num_batched_tokens,
                    "page_size": self.cfg.block_tokens,
                    "max_total_num_tokens": max_total,
                    "version": "llm-gateway-sim",
                }))
            }
            (Profile::Sglang, "/get_model_info") => Some(json!({
                "model_path": self.cfg.name,
                "tokenizer_path": self.cfg.name,
                "is_generation": true,
            })),
            (Profile::Llamacpp, "/props") => self.llama_props(),
            _ => None,
        }
    }
}

pub(super) fn escape_label(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

impl Shared {
    pub(super) fn metrics_text(&self) -> String {
        let model = escape_label(&self.cfg.name);
        let (usage, cached_blocks) = {
            let kv = self.kv.lock();
            (kv.usage(), kv.cached_blocks())
        };
        let load = |a: &AtomicUsize| a.load(Ordering::SeqCst) as f64;
        let count = |a: &AtomicU64| a.load(Ordering::SeqCst) as f64;
        let series: [(&str, &str, &str, f64); 9] = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                load(&self.running),
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                load(&self.waiting),
            ),
            (
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                usage,
            ),
            (
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                count(&self.prompt_tokens_total),
            ),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                count(&self.generation_tokens_total),
            ),
            (
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                count(&self.prefix_cache_queries_total),
            ),
            (
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                count(&self.prefix_cache_hits_total),
            ),
            (
                "sim:prefix_cache_blocks",
                "gauge",
                "Blocks in the simulated prefix cache, idle or in use.",
                cached_blocks as f64,
            ),
            (
                "sim:requests_total",
                "counter",
                "Completion requests received.",
                self.stats.requests.load(Ordering::SeqCst) as f64,
            ),
        ];
        let mut out = String::with_capacity(2048);
        for (name, kind, help, value) in series {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{model_name=\"{model}\"}} {value}");
        }
        // vLLM's info gauge for its cache config: the value is always 1 and
        // the numbers are labels, from which a gateway derives KV capacity in
        // tokens (block_size x num_gpu_blocks). Like vLLM's it has no
        // model_name label. vLLM allocates whole blocks, so a capacity that
        // is not a multiple of the block size is reported rounded down.
        let block = self.cfg.block_tokens;
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{block}\",num_gpu_blocks=\"{}\"}} 1",
            self.cfg.kv_capacity_tokens / block
        );
        out
    }
}
