//! Answering one request: the engine's endpoints, the test controls they
//! obey, and a completion request turned into a [`Plan`] and answered,
//! streamed or whole.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use tokio::io::AsyncWrite;
use tokio::time::sleep;

use super::apis::Refusal;
use super::plan::{conversation, error_body, sse_frame, Generated, Plan};
use super::{InFlight, Shared, JSON};
use crate::config::Profile;
use crate::http::{self, Request, StreamFraming};
use crate::kv::{self, Kind};
use crate::stats::{RecordedRequest, RECORDED_LIMIT};

/// A bound on completion length so that a typo cannot make the engine
/// build a gigabyte response.
const MAX_COMPLETION_TOKENS: u64 = 1_000_000;
/// `Faults::stall` is a plain atomic that tests flip, so stalled requests
/// poll it; this is how long a cleared stall can go unnoticed.
const STALL_POLL: Duration = Duration::from_millis(5);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Decrements `fail_next` if positive; true if this request must fail.
fn take_one(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn check_tokens(n: u64) -> Result<(), String> {
    if (1..=MAX_COMPLETION_TOKENS).contains(&n) {
        Ok(())
    } else {
        Err(format!(
            "max_tokens must be between 1 and {MAX_COMPLETION_TOKENS}"
        ))
    }
}

/// A Responses body without its `instructions`, for the input that
/// continues an earlier turn.
fn without_instructions(body: &Value) -> Value {
    let mut body = body.clone();
    if let Some(b) = body.as_object_mut() {
        b.remove("instructions");
    }
    body
}

fn header_number(req: &Request, name: &str) -> Result<Option<u64>, String> {
    req.header(name)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| format!("{name} must be a non-negative integer"))
        })
        .transpose()
}

impl Shared {
    /// Answers one request. `Ok(true)` if the connection can carry another.
    pub(crate) async fn respond<W: AsyncWrite + Unpin>(
        &self,
        req: &Request,
        wr: &mut W,
    ) -> io::Result<bool> {
        let health = req.method == "GET" && req.path == self.cfg.health_path;
        let probe =
            health || (req.method == "GET" && matches!(req.path.as_str(), "/health" | "/metrics"));
        if !probe {
            self.record(req);
        }
        if health {
            self.stats.health_checks.fetch_add(1, Ordering::SeqCst);
            let delay = self.faults.health_delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                sleep(Duration::from_millis(delay)).await;
            }
        }
        let keep_alive = req.keep_alive;
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/chat/completions") => self.completion(req, Kind::Chat, wr).await,
            ("POST", "/v1/completions") => self.completion(req, Kind::Text, wr).await,
            ("POST", "/v1/messages") => self.completion(req, Kind::Messages, wr).await,
            ("POST", "/v1/responses") => self.completion(req, Kind::Responses, wr).await,
            ("GET", "/v1/models") => {
                let body = json!({
                    "object": "list",
                    "data": [{
                        "id": self.cfg.name,
                        "object": "model",
                        "created": unix_now(),
                        "owned_by": "sim",
                    }],
                });
                http::write_response(wr, 200, JSON, body.to_string().as_bytes(), keep_alive)
                    .await?;
                Ok(true)
            }
            ("GET", _) if health && self.cfg.profile == Profile::Llamacpp => {
                let (status, body) = self.llama_health();
                http::write_response(wr, status, JSON, body.as_bytes(), keep_alive).await?;
                Ok(true)
            }
            ("GET", _) if health => {
                http::write_response(wr, self.health_status(), "", b"", keep_alive).await?;
                Ok(true)
            }
            ("GET", path) if self.profile_endpoint(path).is_some() => {
                let body = self.profile_endpoint(path).unwrap_or_default();
                http::write_response(wr, 200, JSON, body.to_string().as_bytes(), keep_alive)
                    .await?;
                Ok(true)
            }
            ("GET", "/metrics") => {
                let mut text = match self.cfg.profile {
                    Profile::Slots => self.metrics_text(),
                    Profile::Vllm => self.vllm_metrics(),
                    Profile::Sglang => self.sglang_metrics(),
                    Profile::Llamacpp => self.llamacpp_metrics(),
                };
                text.push_str(&self.sim_counters());
                http::write_response(
                    wr,
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    text.as_bytes(),
                    keep_alive,
                )
                .await?;
                Ok(true)
            }
            _ => {
                let message = format!("no route for {} {}", req.method, req.path);
                http::write_response(
                    wr,
                    404,
                    JSON,
                    &error_body("not_found", &message),
                    keep_alive,
                )
                .await?;
                Ok(true)
            }
        }
    }

    pub(super) fn record(&self, req: &Request) {
        let entry = RecordedRequest {
            method: req.method.clone(),
            path: req.target.clone(),
            headers: req.headers.clone(),
            body: req.body.clone(),
        };
        let mut recorded = self.stats.recorded.lock();
        if recorded.len() >= RECORDED_LIMIT {
            let excess = recorded.len() + 1 - RECORDED_LIMIT;
            recorded.drain(..excess);
        }
        recorded.push(entry);
    }

    pub(super) fn health_status(&self) -> u16 {
        match self.faults.health_status.load(Ordering::SeqCst) {
            0 if self.faults.health_down.load(Ordering::SeqCst) => 503,
            0 => 200,
            s if (200..=599).contains(&s) => s,
            // Not a status a client could take as a final response.
            _ => 500,
        }
    }

    pub(super) fn plan(&self, req: &Request, kind: Kind) -> Result<Plan, Refusal> {
        let invalid = |message: String| Refusal::invalid(kind, &message);
        let body: Value = serde_json::from_slice(&req.body)
            .map_err(|e| invalid(format!("request body is not valid JSON: {e}")))?;
        if !body.is_object() {
            return Err(invalid("request body must be a JSON object".into()));
        }
        let mut prompt = kv::prompt_bytes(kind, &body).map_err(invalid)?;
        let previous_response_id = match body.get("previous_response_id") {
            _ if kind != Kind::Responses => None,
            None | Some(Value::Null) => None,
            Some(Value::String(id)) => Some(id.clone()),
            Some(_) => return Err(invalid("`previous_response_id` must be a string".into())),
        };
        if let Some(id) = &previous_response_id {
            // As OpenAI's stateful API (and vLLM's): the earlier turn's
            // conversation, then this request's input; its `instructions`
            // are not carried over, and this request's stand only when it
            // starts a conversation.
            let earlier = self
                .responses
                .lock()
                .get(id)
                .ok_or_else(|| Refusal::unknown_response(id))?;
            let input = kv::prompt_bytes(kind, &without_instructions(&body)).map_err(invalid)?;
            prompt = [&earlier[..], &input[..]].concat();
        }
        let requested = self.requested_tokens(req, kind, &body).map_err(invalid)?;
        let gate = req
            .header("x-sim-gate")
            .map(str::to_string)
            .filter(|g| !g.is_empty());
        let prefill_gate = req
            .header("x-sim-prefill-gate")
            .map(str::to_string)
            .filter(|g| !g.is_empty());
        let number = |name| header_number(req, name).map_err(invalid);
        let paced = number("x-sim-frame-delay-ms")?;
        let frame_delay = paced.unwrap_or(self.cfg.decode_ms_per_token);
        let extra_ttft = number("x-sim-ttft-ms")?.unwrap_or(0);
        let decoy_usage = match kind {
            Kind::Chat | Kind::Text => number("x-sim-decoy-usage")?,
            Kind::Messages | Kind::Responses => None,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let prefix = match kind {
            Kind::Chat => "chatcmpl-",
            Kind::Text => "cmpl-",
            Kind::Messages => "msg_",
            Kind::Responses => "resp_",
        };
        let (max_tokens, cut) = requested.unwrap_or((self.cfg.default_max_tokens, false));
        Ok(Plan {
            kind,
            id: format!("{prefix}sim{}-{id}", self.addr.port()),
            created: unix_now(),
            // vLLM answers with the name it was asked for (it rejects others);
            // echoing it lets tests see what the gateway sent upstream.
            model: body
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or(&self.cfg.name)
                .to_string(),
            prompt_tokens: kv::token_count(&prompt),
            prompt,
            max_tokens,
            // The default length stands for the model ending on its own; a
            // limit is what cut it short.
            finish_reason: if cut { "length" } else { "stop" },
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            frame_delay: Duration::from_millis(frame_delay),
            paced: paced.is_some(),
            extra_ttft: Duration::from_millis(extra_ttft),
            decoy_usage,
            gate,
            prefill_gate,
            previous_response_id,
            store: kind == Kind::Responses
                && body.get("store").and_then(Value::as_bool).unwrap_or(true),
        })
    }

    /// The completion's length and whether a limit cut it: `x-sim-max-tokens`
    /// exactly; chat and completions the body's limit exactly (vLLM's
    /// precedence: the newer name wins); Messages (`max_tokens`, which
    /// every Anthropic request sets) and Responses (`max_output_tokens`) a
    /// limit on the default length, which cuts it only when it is shorter.
    pub(super) fn requested_tokens(
        &self,
        req: &Request,
        kind: Kind,
        body: &Value,
    ) -> Result<Option<(usize, bool)>, String> {
        if let Some(n) = header_number(req, "x-sim-max-tokens")? {
            check_tokens(n)?;
            return Ok(Some((n as usize, true)));
        }
        let names: &[&str] = match kind {
            Kind::Chat | Kind::Text => &["max_completion_tokens", "max_tokens"],
            Kind::Messages => &["max_tokens"],
            Kind::Responses => &["max_output_tokens"],
        };
        let Some(v) = names
            .iter()
            .find_map(|k| body.get(*k).filter(|v| !v.is_null()))
        else {
            return Ok(None);
        };
        let n = v.as_u64().ok_or("max_tokens must be a positive integer")?;
        check_tokens(n)?;
        let n = n as usize;
        Ok(Some(match kind {
            Kind::Chat | Kind::Text => (n, true),
            Kind::Messages | Kind::Responses => {
                let natural = self.cfg.default_max_tokens;
                (n.min(natural), n <= natural)
            }
        }))
    }

    pub(super) async fn completion<W: AsyncWrite + Unpin>(
        &self,
        req: &Request,
        kind: Kind,
        wr: &mut W,
    ) -> io::Result<bool> {
        self.stats.requests.fetch_add(1, Ordering::SeqCst);
        let _in_flight = InFlight::enter(&self.stats.in_flight);
        let keep_alive = req.keep_alive;
        while self.faults.stall.load(Ordering::SeqCst) {
            sleep(STALL_POLL).await;
        }
        if take_one(&self.faults.fail_next) {
            let body = error_body("internal_error", "simulated engine failure");
            http::write_response(wr, 500, JSON, &body, keep_alive).await?;
            return Ok(true);
        }
        if req.header("x-sim-echo") == Some("1") {
            http::write_response(wr, 200, "application/octet-stream", &req.body, keep_alive)
                .await?;
            return Ok(true);
        }
        let plan = match self.plan(req, kind).and_then(|plan| self.fits(plan)) {
            Ok(plan) => plan,
            Err(refusal) => {
                http::write_response(wr, refusal.status, JSON, &refusal.body, keep_alive).await?;
                return Ok(true);
            }
        };
        if !plan.stream {
            let Generated::Done { cached_tokens } = self.generate(&plan, wr, None).await? else {
                return Ok(false);
            };
            self.keep_response(&plan);
            let text = plan.text();
            let body = match kind {
                Kind::Chat | Kind::Text => {
                    let choice = if kind == Kind::Chat {
                        json!({
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "logprobs": null,
                            "finish_reason": plan.finish_reason,
                        })
                    } else {
                        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": plan.finish_reason})
                    };
                    json!({
                        "id": plan.id,
                        "object": plan.object(),
                        "created": plan.created,
                        "model": plan.model,
                        "choices": [choice],
                        "usage": plan.usage(cached_tokens),
                    })
                }
                Kind::Messages => plan.messages_answer(cached_tokens),
                Kind::Responses => plan.responses_answer(cached_tokens),
            };
            http::write_response(wr, 200, JSON, body.to_string().as_bytes(), keep_alive).await?;
            return Ok(true);
        }

        let framing = if req.http10 {
            StreamFraming::UntilClose
        } else {
            StreamFraming::Chunked
        };
        // Headers go out before queueing and prefill, as vLLM's streaming
        // response does: time to first byte is not time to first token.
        http::write_stream_head(wr, "text/event-stream", framing, keep_alive).await?;
        let Generated::Done { cached_tokens } = self.generate(&plan, wr, Some(framing)).await?
        else {
            return Ok(false);
        };
        self.keep_response(&plan);
        let end = match kind {
            Kind::Chat | Kind::Text => None,
            Kind::Messages => Some(plan.messages_end()),
            Kind::Responses => Some(plan.responses_end(cached_tokens)),
        };
        if let Some(end) = end {
            // The typed APIs end with their closing events, no `[DONE]`.
            http::write_stream_chunk(wr, framing, &end).await?;
            http::write_stream_end(wr, framing).await?;
            return Ok(true);
        }
        if plan.include_usage {
            let frame = sse_frame(&json!({
                "id": plan.id,
                "object": plan.chunk_object(),
                "created": plan.created,
                "model": plan.model,
                "choices": [],
                "usage": plan.usage(cached_tokens),
            }));
            http::write_stream_chunk(wr, framing, &frame).await?;
        }
        http::write_stream_chunk(wr, framing, b"data: [DONE]\n\n").await?;
        http::write_stream_end(wr, framing).await?;
        // An HTTP/1.0 stream ends with the close, which the caller does
        // because such requests are never keep-alive.
        Ok(true)
    }

    /// A Responses turn, kept (unless the request said `store: false`) for
    /// a later `previous_response_id`: its conversation and its reply.
    pub(super) fn keep_response(&self, plan: &Plan) {
        if plan.store {
            self.responses
                .lock()
                .put(plan.id.clone(), conversation(plan));
        }
    }
}

impl Shared {
    /// llama-server's `/health`: `{"status":"ok"}`, or its 503 while
    /// (here: as if) loading the model.
    pub(super) fn llama_health(&self) -> (u16, String) {
        match self.health_status() {
            200 => (200, json!({"status": "ok"}).to_string()),
            status => (
                status,
                json!({"error": {"code": status, "message": "Loading model", "type": "unavailable_error"}})
                    .to_string(),
            ),
        }
    }

    /// llama-server's `/props`, the parts a router reads.
    pub(super) fn llama_props(&self) -> Option<Value> {
        let llama = self.llama.as_ref()?;
        Some(json!({
            "default_generation_settings": {
                "id": 0,
                "id_task": -1,
                "n_ctx": llama.n_ctx_slot(),
                "speculative": false,
                "is_processing": false,
                "params": {
                    "n_predict": -1,
                    "temperature": 0.8,
                    "top_k": 40,
                    "top_p": 0.95,
                    "min_p": 0.05,
                    "stream": true,
                    "cache_prompt": true,
                },
            },
            "total_slots": llama.total_slots(),
            "model_path": self.cfg.name,
            "chat_template": "",
            "build_info": "llm-gateway-sim",
        }))
    }
}
