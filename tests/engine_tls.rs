//! TLS to engines through the real binary (issue 44, item 3): each
//! simulated engine behind a TLS-terminating relay (tokio-rustls) whose
//! certificate a private CA made at test time (rcgen) signed, and that
//! asks the gateway for a client certificate from that CA. A peer's `tls:`
//! names the CA, the client certificate and the name to check.

mod common;

/// Without the `tls` feature a route file whose peer sets `tls:` is
/// refused, with its file and line, not served in plain text.
#[cfg(not(feature = "tls"))]
#[test]
fn without_the_tls_feature_a_peers_tls_fails_the_check_with_its_line() {
    let dir = tempfile::tempdir().expect("dir");
    let routes = dir.path().join("routes");
    std::fs::create_dir_all(&routes).expect("routes");
    std::fs::write(
        routes.join("chat.yaml"),
        "peers:\n  - name: a\n    host: 127.0.0.1\n    port: 8001\n    tls: {sni: engine.test}\n",
    )
    .expect("route");
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, format!("routes_dir: {}\n", routes.display())).expect("config");
    let out = std::process::Command::new(common::gateway_bin())
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .expect("run");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("chat.yaml:5:"), "{said}");
    assert!(said.contains("build with --features tls"), "{said}");
}

#[cfg(feature = "tls")]
mod with_tls {
    use super::common::*;
    use rustls::pki_types::pem::PemObject;
    use serde_json::Value;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::common::certs::{leaf, new_ca, TestCa as Ca};

    /// The files a peer's `tls:` names: the CA, and the gateway's client
    /// certificate and key.
    struct Files {
        dir: tempfile::TempDir,
        ca: PathBuf,
        client_cert: PathBuf,
        client_key: PathBuf,
    }

    fn files(ca: &Ca) -> Files {
        let dir = tempfile::tempdir().expect("dir");
        let (cert, key) = leaf(
            ca,
            "gateway.test",
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        );
        let f = Files {
            ca: dir.path().join("ca.pem"),
            client_cert: dir.path().join("client.pem"),
            client_key: dir.path().join("client.key"),
            dir,
        };
        std::fs::write(&f.ca, &ca.pem).expect("ca");
        std::fs::write(&f.client_cert, cert.pem()).expect("cert");
        std::fs::write(&f.client_key, key.serialize_pem()).expect("key");
        f
    }

    /// A TLS-terminating relay on 127.0.0.1 in front of a plain engine: its
    /// certificate is for `engine.test` from `ca`, and it takes only
    /// clients whose certificate `ca` signed.
    struct Relay {
        port: u16,
        handshakes: Arc<AtomicUsize>,
        refused: Arc<AtomicUsize>,
    }

    impl Relay {
        fn start(ca: &Ca, engine_port: u16) -> Relay {
            let (cert, key) = leaf(
                ca,
                "engine.test",
                rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            );
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut roots = rustls::RootCertStore::empty();
            let ca_der = rustls::pki_types::CertificateDer::from_pem_slice(ca.pem.as_bytes())
                .expect("CA der");
            roots.add(ca_der).expect("root");
            let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                Arc::clone(&provider),
            )
            .build()
            .expect("client verifier");
            let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
            let config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_client_cert_verifier(clients)
                .with_single_cert(vec![cert.der().clone()], key)
                .expect("server certificate");
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.set_nonblocking(true).expect("nonblocking");
            let port = listener.local_addr().expect("addr").port();
            let handshakes = Arc::new(AtomicUsize::new(0));
            let refused = Arc::new(AtomicUsize::new(0));
            let (ok, bad) = (Arc::clone(&handshakes), Arc::clone(&refused));
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                    while let Ok((tcp, _)) = listener.accept().await {
                        let (acceptor, ok, bad) =
                            (acceptor.clone(), Arc::clone(&ok), Arc::clone(&bad));
                        tokio::spawn(async move {
                            let Ok(mut tls) = acceptor.accept(tcp).await else {
                                bad.fetch_add(1, Ordering::Relaxed);
                                return;
                            };
                            ok.fetch_add(1, Ordering::Relaxed);
                            let Ok(mut engine) =
                                tokio::net::TcpStream::connect(("127.0.0.1", engine_port)).await
                            else {
                                return;
                            };
                            let _ = tokio::io::copy_bidirectional(&mut tls, &mut engine).await;
                        });
                    }
                });
            });
            Relay {
                port,
                handshakes,
                refused,
            }
        }

        fn handshakes(&self) -> usize {
            self.handshakes.load(Ordering::Relaxed)
        }

        fn refused(&self) -> usize {
            self.refused.load(Ordering::Relaxed)
        }
    }

    /// A peer line over TLS to `relay`, checked as `engine.test` against
    /// `ca` (the CA file the gateway trusts), with the client certificate
    /// of `client` when given.
    fn tls_peer(name: &str, relay: &Relay, ca: &Path, client: Option<&Files>) -> String {
        let client = client.map_or(String::new(), |f| {
            format!(
                ", client_cert: {}, client_key: {}",
                f.client_cert.display(),
                f.client_key.display()
            )
        });
        format!(
            "  - {{name: {name}, host: 127.0.0.1, port: {}, tls: {{sni: engine.test, ca_file: {}{client}}}}}\n",
            relay.port,
            ca.display()
        )
    }

    /// [`tls_peer`] with the `tls:` map's text given whole.
    fn tls_peer_with(name: &str, relay: &Relay, tls: &str) -> String {
        format!(
            "  - {{name: {name}, host: 127.0.0.1, port: {}, tls: {{{tls}}}}}\n",
            relay.port
        )
    }

    /// Probes and scrapes often, so that a verdict comes within the test.
    const FAST: &str =
        "health: {interval: 200ms, ban_ttl: 30s, timeout: 2s}\nengine_metrics: {interval: 200ms}\n";

    fn peer_of<'a>(status: &'a Value, name: &str) -> &'a Value {
        status["peers"]
            .as_array()
            .and_then(|peers| peers.iter().find(|p| p["name"] == name))
            .unwrap_or_else(|| panic!("no peer {name} in {status}"))
    }

    fn health(gw: &Gateway, route: &str) -> Value {
        http::get(gw.addr, &format!("/{route}/_health_status")).json()
    }

    fn state(gw: &Gateway, route: &str) -> Value {
        http::get(gw.addr, &format!("/{route}/_route_state")).json()
    }

    /// Waits until `peer`'s probe says `verdict` and returns its status.
    fn probed(gw: &Gateway, route: &str, peer: &str, verdict: &str) -> Value {
        wait_for(&format!("{peer}'s probe: {verdict}"), DEADLINE, || {
            let status = health(gw, route);
            let p = peer_of(&status, peer);
            (p["last_probe"] == verdict).then(|| p.clone())
        })
    }

    /// A streamed chat turn of `session`: its routed peer and mode, and
    /// that the stream ended whole.
    fn stream_turn(gw: &Gateway, route: &str, session: &str) -> (String, String) {
        let r = http::post_json(
            gw.addr,
            &format!("/{route}/v1/chat/completions"),
            &[("x-session-id", session)],
            &chat_body(session, "hello over mTLS", true),
        );
        assert_eq!(r.status(), 200, "{}", r.text());
        assert!(
            r.text().trim_end().ends_with("data: [DONE]"),
            "{}",
            r.text()
        );
        (
            r.header("x-routed-peer").expect("peer").to_string(),
            r.header("x-routed-mode").expect("mode").to_string(),
        )
    }

    #[test]
    fn a_stream_reaches_mtls_engines_through_a_private_ca_sticks_and_is_probed_and_scraped() {
        let ca = new_ca("engines");
        let f = files(&ca);
        let cluster = engines(2);
        let relays: Vec<Relay> = ports(&cluster)
            .iter()
            .map(|&p| Relay::start(&ca, p))
            .collect();
        let route = format!(
            "peers:\n{}{}{FAST}",
            tls_peer("e0", &relays[0], &f.ca, Some(&f)),
            tls_peer("e1", &relays[1], &f.ca, Some(&f)),
        );
        let gw = Gateway::start(&[("chat", route)]);
        for name in ["e0", "e1"] {
            // The probe passed over TLS, and the scrape's sample is there.
            let p = probed(&gw, "chat", name, "ready");
            assert_eq!(p["last_error"], Value::Null, "{p}");
            assert_eq!(p["tls"], true, "{p}");
            wait_for(&format!("{name}'s engine metrics"), DEADLINE, || {
                let s = state(&gw, "chat");
                (!peer_of(&s, name)["engine"].is_null()).then_some(())
            });
        }
        let (first, _) = stream_turn(&gw, "chat", "mtls-session");
        for _ in 0..3 {
            let (peer, mode) = stream_turn(&gw, "chat", "mtls-session");
            assert_eq!(peer, first, "the session stays on its engine");
            assert_eq!(mode, "sticky");
        }
        // Requests and probes reached the engines through the relays only
        // (the gateway knows no other port), each after a verified
        // handshake: none refused.
        let served: u64 = cluster
            .engines
            .iter()
            .map(|e| e.stats.requests.load(Ordering::SeqCst))
            .sum();
        assert_eq!(served, 4);
        for e in &cluster.engines {
            assert!(e.stats.health_checks.load(Ordering::SeqCst) > 0);
        }
        assert!(relays
            .iter()
            .all(|r| r.handshakes() > 0 && r.refused() == 0));
        drop(f.dir);
    }

    #[test]
    fn a_peer_whose_ca_is_wrong_is_banned_with_the_reason_while_the_right_one_serves() {
        let (ca, other) = (new_ca("engines"), new_ca("someone else"));
        let (right, wrong) = (files(&ca), files(&other));
        let cluster = engines(2);
        let good = Relay::start(&ca, cluster.engines[0].port());
        let bad = Relay::start(&ca, cluster.engines[1].port());
        let route = format!(
            "peers:\n{}{}{FAST}",
            tls_peer("good", &good, &right.ca, Some(&right)),
            // The client certificate is right; the CA it checks with is not.
            tls_peer("bad", &bad, &wrong.ca, Some(&right)),
        );
        let gw = Gateway::start(&[("chat", route)]);
        let b = probed(&gw, "chat", "bad", "down");
        assert_eq!(b["ready"], false, "{b}");
        assert_eq!(
            b["last_error"], "TLS: certificate verify failed: UnknownIssuer",
            "{b}"
        );
        // Control: the same route's peer with the right CA is up, probed
        // and scraped over TLS; the wrong one has no sample.
        let g = probed(&gw, "chat", "good", "ready");
        assert_eq!(
            (g["ready"].clone(), g["last_error"].clone()),
            (Value::Bool(true), Value::Null)
        );
        wait_for("good's engine metrics", DEADLINE, || {
            let s = state(&gw, "chat");
            (!peer_of(&s, "good")["engine"].is_null()).then_some(())
        });
        assert!(peer_of(&state(&gw, "chat"), "bad")["engine"].is_null());
        for i in 0..4 {
            let (peer, _) = stream_turn(&gw, "chat", &format!("s{i}"));
            assert_eq!(peer, "good");
        }
        assert!(bad.refused() > 0, "the gateway did try the wrong one");
        assert_eq!(cluster.engines[1].stats.requests.load(Ordering::SeqCst), 0);
        assert_eq!(
            cluster.engines[1]
                .stats
                .health_checks
                .load(Ordering::SeqCst),
            0
        );
    }

    #[test]
    fn a_failed_verification_on_a_proxied_request_bans_its_peer_as_a_refused_connection_does() {
        let (ca, other) = (new_ca("engines"), new_ca("someone else"));
        let (right, wrong) = (files(&ca), files(&other));
        let cluster = engines(2);
        let (first, second) = (
            Relay::start(&ca, cluster.engines[0].port()),
            Relay::start(&ca, cluster.engines[1].port()),
        );
        // No probes, no scrapes: a ban here can only come from a request.
        let quiet = "health: {enabled: false}\nengine_metrics: false\n";
        let gw = Gateway::start(&[
            (
                "wrong",
                format!(
                    "peers:\n{}{quiet}",
                    tls_peer("w", &first, &wrong.ca, Some(&right))
                ),
            ),
            (
                "right",
                format!(
                    "peers:\n{}{quiet}",
                    tls_peer("r", &second, &right.ca, Some(&right))
                ),
            ),
        ]);
        let r = http::post_json(
            gw.addr,
            "/wrong/v1/chat/completions",
            &[],
            &chat_body("one", "hello", false),
        );
        assert!(
            matches!(r.status(), 502 | 503),
            "{} {}",
            r.status(),
            r.text()
        );
        let w = peer_of(&health(&gw, "wrong"), "w").clone();
        assert_eq!(
            (w["ready"].clone(), w["failing"].clone()),
            (Value::Bool(false), Value::Bool(true)),
            "{w}"
        );
        assert_eq!(
            w["last_error"], "TLS: certificate verify failed: UnknownIssuer",
            "{w}"
        );
        // Control: the same request to the peer with the right CA is served,
        // and nothing is banned.
        let r = http::post_json(
            gw.addr,
            "/right/v1/chat/completions",
            &[],
            &chat_body("one", "hello", false),
        );
        assert_eq!(r.status(), 200, "{}", r.text());
        let ok = peer_of(&health(&gw, "right"), "r").clone();
        assert_eq!(
            (ok["ready"].clone(), ok["last_error"].clone()),
            (Value::Bool(true), Value::Null),
            "{ok}"
        );
    }

    #[test]
    fn an_engine_that_wants_a_client_certificate_bans_a_peer_without_one() {
        let ca = new_ca("engines");
        let f = files(&ca);
        let cluster = engines(2);
        let with = Relay::start(&ca, cluster.engines[0].port());
        let without = Relay::start(&ca, cluster.engines[1].port());
        let route = format!(
            "peers:\n{}{}{FAST}",
            tls_peer("with", &with, &f.ca, Some(&f)),
            tls_peer("without", &without, &f.ca, None),
        );
        let gw = Gateway::start(&[("chat", route)]);
        let w = probed(&gw, "chat", "without", "down");
        assert_eq!(w["ready"], false, "{w}");
        let why = w["last_error"].as_str().unwrap_or_default().to_string();
        // TLS 1.3: the engine refuses after the gateway's Finished, with an alert.
        assert!(why.starts_with("TLS: ") && why.contains("alert"), "{w}");
        assert!(without.refused() > 0);
        // Control: the peer with the certificate, same CA, same route, serves.
        let ok = probed(&gw, "chat", "with", "ready");
        assert_eq!(ok["last_error"], Value::Null, "{ok}");
        for i in 0..3 {
            assert_eq!(stream_turn(&gw, "chat", &format!("c{i}")).0, "with");
        }
    }

    #[test]
    fn a_wrong_name_is_refused_and_verify_off_takes_any_certificate() {
        let (ca, other) = (new_ca("engines"), new_ca("someone else"));
        let (right, wrong) = (files(&ca), files(&other));
        let cluster = engines(3);
        let relays: Vec<Relay> = ports(&cluster)
            .iter()
            .map(|&p| Relay::start(&ca, p))
            .collect();
        let client = format!(
            "client_cert: {}, client_key: {}",
            right.client_cert.display(),
            right.client_key.display()
        );
        // Round robin: new sessions go to every ready peer in turn.
        let route = format!(
            "peers:\n{}{}{}{FAST}balancing: {{mode: round_robin}}\n",
            // The relays' certificate is for engine.test.
            tls_peer_with(
                "misnamed",
                &relays[0],
                &format!("sni: other.test, ca_file: {}, {client}", right.ca.display())
            ),
            tls_peer_with(
                "unverified",
                &relays[1],
                &format!(
                    "sni: engine.test, ca_file: {}, verify: false, {client}",
                    wrong.ca.display()
                )
            ),
            tls_peer_with(
                "named",
                &relays[2],
                &format!(
                    "sni: engine.test, ca_file: {}, {client}",
                    right.ca.display()
                )
            ),
        );
        let gw = Gateway::start(&[("chat", route)]);
        let m = probed(&gw, "chat", "misnamed", "down");
        let why = m["last_error"].as_str().unwrap_or_default();
        assert!(
            why.starts_with(
                "TLS: certificate verify failed: certificate not valid for name \"other.test\""
            ),
            "{m}"
        );
        // Control: the same CA and certificate under the right name.
        assert_eq!(
            probed(&gw, "chat", "named", "ready")["last_error"],
            Value::Null
        );
        // verify: false takes the certificate a wrong CA would refuse, for
        // the probe, the scrape and the requests alike.
        let u = probed(&gw, "chat", "unverified", "ready");
        assert_eq!(u["last_error"], Value::Null, "{u}");
        wait_for("unverified's engine metrics", DEADLINE, || {
            let s = state(&gw, "chat");
            (!peer_of(&s, "unverified")["engine"].is_null()).then_some(())
        });
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..12 {
            seen.insert(stream_turn(&gw, "chat", &format!("v{i}")).0);
        }
        assert!(seen.contains("unverified"), "{seen:?}");
        assert!(!seen.contains("misnamed"), "{seen:?}");
        assert_eq!(
            relays[0].handshakes(),
            0,
            "the misnamed peer's handshakes all failed"
        );
    }
}
