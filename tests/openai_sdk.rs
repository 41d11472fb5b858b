//! The openai Python SDK, as applications use it (no session id), against
//! the gateway on simulated engines: a conversation's turns stay on one
//! engine and its cached tokens grow. The SDK comes from PyPI into a venv
//! (`./dev test` makes it, `target/sdk-venv`); without it the test is
//! skipped loudly outside CI and fails under CI.

mod common;

use common::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// The venv's python with the SDK, or None (then: skip outside CI, fail in CI).
fn sdk_python() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let python = std::env::var_os("LLM_GATEWAY_SDK_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| target.join("sdk-venv/bin/python"));
    let usable = Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !usable {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but {} cannot import openai: `./dev test` makes the venv",
            python.display()
        );
        eprintln!(
            "\n!!!!! SKIPPED: the SDK test needs the openai package in {} \
             (./dev test makes it). It FAILS under CI. !!!!!\n",
            python.display()
        );
        return None;
    }
    Some(python)
}

/// The turns as the script saw them.
fn conversation(python: &PathBuf, gw: &Gateway, mode: &str) -> Vec<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/conversation.py");
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://{}/chat/v1", gw.addr))
        .arg(mode)
        .output()
        .expect("run the SDK script");
    assert!(
        out.status.success(),
        "SDK script failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        gw.log()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn assert_one_engine_growing_cache(turns: &[Value], source: &str) {
    assert_eq!(turns.len(), 3, "{turns:?}");
    for t in turns {
        assert_eq!(t["source"], source, "{turns:?}");
        assert_eq!(t["peer"], turns[0]["peer"], "one engine: {turns:?}");
        assert_eq!(t["session"], turns[0]["session"], "one session: {turns:?}");
    }
    let cached: Vec<u64> = turns
        .iter()
        .map(|t| t["cached"].as_u64().unwrap_or(0))
        .collect();
    assert!(
        cached.windows(2).all(|w| w[1] > w[0]),
        "cached tokens grow: {cached:?}"
    );
}

#[test]
fn the_openai_sdk_without_a_session_id_keeps_its_conversation_on_one_engine() {
    let Some(python) = sdk_python() else { return };
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    assert_one_engine_growing_cache(&conversation(&python, &gw, "none"), "content");
}

#[test]
fn the_openai_sdk_with_prompt_cache_key_keeps_its_conversation_on_one_engine() {
    let Some(python) = sdk_python() else { return };
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    assert_one_engine_growing_cache(
        &conversation(&python, &gw, "prompt-cache-key"),
        "body:prompt_cache_key",
    );
}
