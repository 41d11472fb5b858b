//! TLS on the main listener through the real binary (issue 44, item 1):
//! certificates made at test time (rcgen), a rustls client that trusts
//! exactly them and reports which one the gateway served.

mod common;

/// Starts the gateway with `tls: {cert, key}` and nothing else to serve;
/// the start must be refused (exit 2): what it said on standard error.
fn start_refused(dir: &std::path::Path, cert: &str, key: &str) -> String {
    use common::*;
    std::fs::create_dir_all(dir.join("routes")).expect("routes");
    let config = dir.join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{}\nadmin_listen: 127.0.0.1:{}\nroutes_dir: {}\napi_keys_file: {}\ntls: {{cert: {cert}, key: {key}}}\n",
            free_port(),
            free_port(),
            dir.join("routes").display(),
            dir.join("none").display(),
        ),
    )
    .expect("config");
    let out = std::process::Command::new(gateway_bin())
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stderr
}

/// Without the `tls` feature, `tls:` stops the start and says how to get a
/// build that has it (the feature's own tests are below).
#[cfg(not(feature = "tls"))]
#[test]
fn without_the_tls_feature_tls_stops_the_start_saying_so() {
    let dir = tempfile::tempdir().expect("dir");
    let stderr = start_refused(dir.path(), "/x/tls.crt", "/x/tls.key");
    assert!(stderr.contains("--features tls"), "{stderr}");
}

#[cfg(feature = "tls")]
mod with_tls {

    use super::common::*;
    use bytes::BytesMut;
    use llm_gateway_sim::client::{encode_request, parse_head, Chunked, Head, Upload};
    use rustls::pki_types::{CertificateDer, ServerName};
    use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::Duration;

    const CHAT: &str = "/chat/v1/chat/completions";

    /// A self-signed certificate for `localhost` and its key.
    struct Pair {
        cert_pem: String,
        key_pem: String,
        der: CertificateDer<'static>,
    }

    fn make_pair() -> Pair {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// Writes `pair` over the files as a rotation does: each written apart,
    /// then renamed into place, so the gateway never reads half a file.
    fn install(pair: &Pair, cert: &Path, key: &Path) {
        for (path, text) in [(key, &pair.key_pem), (cert, &pair.cert_pem)] {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text).expect("write");
            std::fs::rename(&tmp, path).expect("rename");
        }
    }

    struct TlsGateway {
        gw: Gateway,
        cert: PathBuf,
        cluster: SimCluster,
        _dir: tempfile::TempDir,
    }

    fn start(first: &Pair, watch: bool) -> TlsGateway {
        start_with(Some(first), watch, "")
    }

    /// A gateway in front of one simulated engine: over TLS with `first`, or
    /// plain; `extra` more gateway.yaml lines.
    fn start_with(first: Option<&Pair>, watch: bool, extra: &str) -> TlsGateway {
        let dir = tempfile::tempdir().expect("dir");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let mut config = extra.to_string();
        if let Some(first) = first {
            install(first, &cert, &key);
            config += &format!(
                "tls: {{cert: {}, key: {}}}\n",
                cert.display(),
                key.display()
            );
        }
        let cluster = engines(1);
        let gw = Gateway::start_with(
            &[("chat", route_yaml(&ports(&cluster), ""))],
            GatewayOptions {
                extra_config: config,
                watch: Some(watch),
                ..Default::default()
            },
        );
        TlsGateway {
            gw,
            cert,
            cluster,
            _dir: dir,
        }
    }

    /// A client connection that trusts `roots` only.
    struct TlsConn {
        stream: StreamOwned<ClientConnection, TcpStream>,
        buf: BytesMut,
    }

    impl TlsConn {
        fn open(addr: SocketAddr, roots: &[&Pair]) -> std::io::Result<TlsConn> {
            let mut store = RootCertStore::empty();
            for pair in roots {
                store.add(pair.der.clone()).expect("root");
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(store)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = ServerName::try_from("localhost").expect("name");
            let conn = ClientConnection::new(Arc::new(config), name).expect("client");
            let tcp = TcpStream::connect(addr)?;
            tcp.set_read_timeout(Some(Duration::from_secs(20)))?;
            let mut stream = StreamOwned::new(conn, tcp);
            while stream.conn.is_handshaking() {
                stream.conn.complete_io(&mut stream.sock)?;
            }
            Ok(TlsConn {
                stream,
                buf: BytesMut::new(),
            })
        }

        /// The leaf certificate the gateway presented.
        fn served(&self) -> CertificateDer<'static> {
            self.stream.conn.peer_certificates().expect("certificates")[0].clone()
        }

        fn fill(&mut self) -> usize {
            let mut block = [0u8; 16 * 1024];
            let n = self.stream.read(&mut block).expect("read");
            self.buf.extend_from_slice(&block[..n]);
            n
        }

        fn send_chat(&mut self, session: &str, headers: &[(&str, &str)]) {
            let body = chat_body(session, "hello over tls", true).to_string();
            let mut all = vec![
                ("Host", "localhost"),
                ("content-type", "application/json"),
                ("x-session-id", session),
            ];
            all.extend_from_slice(headers);
            let out = encode_request("POST", CHAT, &all, body.as_bytes(), Upload::Length);
            self.stream.write_all(&out).expect("write");
        }

        fn head(&mut self) -> Head {
            loop {
                if let Some(head) = parse_head(&mut self.buf).expect("head") {
                    return head;
                }
                assert!(self.fill() > 0, "closed before the head");
            }
        }

        /// A chunked body to its end.
        fn body(&mut self) -> String {
            let mut chunks = Chunked::default();
            let mut out = Vec::new();
            while !chunks.decode(&mut self.buf, &mut out).expect("chunked") {
                assert!(self.fill() > 0, "closed inside the body");
            }
            String::from_utf8_lossy(&out).into_owned()
        }

        /// A streamed chat answered whole: its head and its SSE text.
        fn chat(&mut self, session: &str) -> (Head, String) {
            self.send_chat(session, &[]);
            let head = self.head();
            assert_eq!(head.status, 200);
            (head, self.body())
        }
    }

    fn served_on_a_new_connection(gw: &Gateway, roots: &[&Pair]) -> CertificateDer<'static> {
        TlsConn::open(gw.addr, roots).expect("handshake").served()
    }

    #[test]
    fn a_stream_over_tls_sticks_to_its_session_and_counts_its_ttft() {
        let a = make_pair();
        let t = start(&a, false);
        let mut conn = TlsConn::open(t.gw.addr, &[&a]).expect("handshake");
        assert_eq!(conn.served(), a.der);
        let version = conn.stream.conn.protocol_version();
        assert_eq!(version, Some(rustls::ProtocolVersion::TLSv1_3));
        assert_eq!(conn.stream.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
        let (head, sse) = conn.chat("tls-session");
        assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
        assert_eq!(head.header("x-routed-source"), Some("header:x-session-id"));
        // The same keep-alive connection again: the session is bound.
        let (again, _) = conn.chat("tls-session");
        assert_eq!(again.header("x-routed-mode"), Some("sticky"));
        // Counted in `logging`, after the client has its last byte.
        wait_for("each stream's first token measured", DEADLINE, || {
            let ttfts =
                t.gw.metric("llm_gateway_ttft_seconds_count", &["route=\"chat\""]);
            (ttfts == 2.0).then_some(())
        });

        // TLS 1.2 is offered too.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut store = RootCertStore::empty();
        store.add(a.der.clone()).expect("root");
        let config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS12])
            .expect("versions")
            .with_root_certificates(store)
            .with_no_client_auth();
        let mut c =
            ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
                .expect("client");
        let mut tcp = TcpStream::connect(t.gw.addr).expect("connect");
        while c.is_handshaking() {
            c.complete_io(&mut tcp).expect("TLS 1.2 handshake");
        }
        assert_eq!(c.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_2));

        // Plain HTTP on the TLS port gets no answer as HTTP.
        let plain = http::try_get_within(t.gw.addr, "/chat/v1/models", Duration::from_secs(2));
        assert!(plain.is_none_or(|r| r.status() != 200));
    }

    #[test]
    fn a_rotated_certificate_reaches_new_handshakes_while_a_stream_started_before_finishes() {
        let (a, b) = (make_pair(), make_pair());
        let t = start(&a, true);
        let roots = [&a, &b];
        // A stream held open at the engine across the rotation.
        let mut old = TlsConn::open(t.gw.addr, &roots).expect("handshake");
        assert_eq!(old.served(), a.der);
        old.send_chat("before", &[("x-sim-gate", "rotation")]);
        let head = old.head();
        assert_eq!(head.status, 200);

        let key = t.cert.with_extension("key");
        install(&b, &t.cert, &key);
        wait_for("the new certificate served", DEADLINE, || {
            (served_on_a_new_connection(&t.gw, &roots) == b.der).then_some(())
        });
        assert!(
            t.gw.log().contains("tls: certificate reloaded"),
            "{}",
            t.gw.log()
        );

        t.cluster.engines[0].open_gate("rotation");
        let sse = old.body();
        assert!(
            sse.trim_end().ends_with("data: [DONE]"),
            "the old stream ended whole: {sse}"
        );
        // The connection from before still serves, on the old certificate.
        let (_, again) = old.chat("before");
        assert!(again.contains("[DONE]"));
        assert_eq!(old.served(), a.der);
    }

    #[test]
    fn a_broken_certificate_keeps_the_previous_one_and_says_why() {
        let (a, b) = (make_pair(), make_pair());
        let t = start(&a, false);
        let roots = [&a, &b];
        let key = t.cert.with_extension("key");

        std::fs::write(&t.cert, "-----BEGIN CERTIFICATE-----\nnot base64\n").expect("break");
        t.gw.reload();
        let reason = wait_for("the failure logged", DEADLINE, || {
            t.gw.log()
                .lines()
                .find(|l| l.contains("previous certificate stays"))
                .map(str::to_string)
        });
        assert!(reason.contains(&t.cert.display().to_string()), "{reason}");
        assert_eq!(served_on_a_new_connection(&t.gw, &roots), a.der, "kept");
        let mut conn = TlsConn::open(t.gw.addr, &roots).expect("handshake");
        conn.chat("still-served");

        // Control: the same gateway takes a good pair at the next SIGHUP
        // (watch off: nothing else reloads it).
        install(&b, &t.cert, &key);
        t.gw.reload();
        wait_for("the new certificate served after SIGHUP", DEADLINE, || {
            (served_on_a_new_connection(&t.gw, &roots) == b.der).then_some(())
        });
    }

    #[test]
    fn a_certificate_that_does_not_load_stops_the_start_with_the_file_named() {
        let dir = tempfile::tempdir().expect("dir");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let a = make_pair();
        std::fs::write(&cert, &a.cert_pem).expect("cert");
        std::fs::write(&key, make_pair().key_pem).expect("someone else's key");
        let stderr = super::start_refused(
            dir.path(),
            &cert.display().to_string(),
            &key.display().to_string(),
        );
        assert!(
            stderr.contains("does not belong") && stderr.contains(&key.display().to_string()),
            "{stderr}"
        );
    }

    /// A client speaking h2 (over TLS with ALPN, or cleartext with prior
    /// knowledge) to the gateway at `addr`.
    struct H2Client {
        send: h2::client::SendRequest<bytes::Bytes>,
        runtime: tokio::runtime::Runtime,
        alpn: Option<Vec<u8>>,
    }

    impl H2Client {
        fn connect(addr: SocketAddr, tls: Option<&Pair>) -> H2Client {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let (send, alpn) = runtime.block_on(async {
                let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
                match tls {
                    None => {
                        let (send, conn) = h2::client::handshake(tcp).await.expect("h2c handshake");
                        tokio::spawn(async move { conn.await.ok() });
                        (send, None)
                    }
                    Some(pair) => {
                        let mut store = RootCertStore::empty();
                        store.add(pair.der.clone()).expect("root");
                        let provider = Arc::new(rustls::crypto::ring::default_provider());
                        let mut config = ClientConfig::builder_with_provider(provider)
                            .with_safe_default_protocol_versions()
                            .expect("versions")
                            .with_root_certificates(store)
                            .with_no_client_auth();
                        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
                        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
                        let name = ServerName::try_from("localhost").expect("name");
                        let io = connector.connect(name, tcp).await.expect("handshake");
                        let alpn = io.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                        let (send, conn) = h2::client::handshake(io).await.expect("h2 handshake");
                        tokio::spawn(async move { conn.await.ok() });
                        (send, alpn)
                    }
                }
            });
            H2Client {
                send,
                runtime,
                alpn,
            }
        }

        /// Streamed chats sent at once, each on its own stream of the one
        /// connection, without Content-Length (h2 frames the body); their heads
        /// and SSE texts.
        fn chats(&mut self, sessions: &[&str]) -> Vec<(::http::response::Parts, String)> {
            let send = self.send.clone();
            self.runtime.block_on(async move {
                let mut pending = Vec::new();
                for session in sessions {
                    let mut send = send.clone().ready().await.expect("ready");
                    let request = ::http::Request::builder()
                        .method("POST")
                        .uri(format!("https://localhost{CHAT}"))
                        .header("content-type", "application/json")
                        .header("x-session-id", *session)
                        .body(())
                        .expect("request");
                    let (response, mut body) = send.send_request(request, false).expect("send");
                    let chat = chat_body(session, "hello over h2", true).to_string();
                    body.send_data(bytes::Bytes::from(chat), true)
                        .expect("body");
                    pending.push(tokio::spawn(async move {
                        let (parts, mut recv) = response.await.expect("response").into_parts();
                        let mut text = Vec::new();
                        while let Some(chunk) = recv.data().await {
                            let chunk = chunk.expect("data");
                            recv.flow_control().release_capacity(chunk.len()).ok();
                            text.extend_from_slice(&chunk);
                        }
                        (parts, String::from_utf8_lossy(&text).into_owned())
                    }));
                }
                let mut out = Vec::new();
                for p in pending {
                    out.push(p.await.expect("stream task"));
                }
                out
            })
        }
    }

    impl H2Client {
        /// The status of one chat whose prompt is `content`.
        fn status_of(&mut self, content: &str) -> u16 {
            let send = self.send.clone();
            let chat = chat_body("h2-big", content, false).to_string();
            self.runtime.block_on(async move {
                let mut send = send.ready().await.expect("ready");
                let request = ::http::Request::builder()
                    .method("POST")
                    .uri(format!("https://localhost{CHAT}"))
                    .header("content-type", "application/json")
                    .body(())
                    .expect("request");
                let (response, mut body) = send.send_request(request, false).expect("send");
                body.send_data(bytes::Bytes::from(chat), true)
                    .expect("body");
                response.await.expect("response").status().as_u16()
            })
        }
    }

    fn assert_streamed(answers: &[(::http::response::Parts, String)]) {
        for (head, sse) in answers {
            assert_eq!(head.status, 200, "{sse}");
            assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
        }
    }

    #[test]
    fn h2_by_alpn_streams_concurrently_on_one_connection_and_sticks() {
        let a = make_pair();
        let t = start(&a, false);
        let mut client = H2Client::connect(t.gw.addr, Some(&a));
        assert_eq!(client.alpn.as_deref(), Some(&b"h2"[..]));
        let first = client.chats(&["h2-one", "h2-two", "h2-three"]);
        assert_streamed(&first);
        for (head, _) in &first {
            assert_eq!(
                head.headers.get("x-routed-source").map(|v| v.as_bytes()),
                Some(&b"header:x-session-id"[..])
            );
        }
        // Each session's next turn, on new streams of the same connection.
        let again = client.chats(&["h2-one", "h2-two"]);
        assert_streamed(&again);
        for (head, _) in &again {
            assert_eq!(
                head.headers.get("x-routed-mode").map(|v| v.as_bytes()),
                Some(&b"sticky"[..])
            );
        }
        wait_for("every stream's first token measured", DEADLINE, || {
            let ttfts =
                t.gw.metric("llm_gateway_ttft_seconds_count", &["route=\"chat\""]);
            (ttfts == 5.0).then_some(())
        });
    }

    #[test]
    fn h2c_with_prior_knowledge_when_configured() {
        let t = start_with(None, false, "h2c: true\n");
        let mut client = H2Client::connect(t.gw.addr, None);
        assert_streamed(&client.chats(&["h2c-one", "h2c-two"]));
        // A body over Pingora's 64 KiB retry buffer cannot be replayed over
        // h2: refused, not hung.
        let big = "x ".repeat(40_000);
        assert_eq!(client.status_of(&big), 413);
        // Control: HTTP/1.1 on the same listener forwards it (the replay).
        let r = http::post_json(t.gw.addr, CHAT, &[], &chat_body("h1-big", &big, false));
        assert_eq!(r.status(), 200, "{}", r.text());

        // Control: without `h2c` the preface is not served as h2.
        let plain = start_with(None, false, "");
        let refused = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let tcp = tokio::net::TcpStream::connect(plain.gw.addr)
                    .await
                    .expect("connect");
                let (send, conn) = h2::client::handshake(tcp).await.expect("client side");
                tokio::spawn(async move { conn.await.ok() });
                let request = ::http::Request::builder()
                    .uri(format!("http://localhost{CHAT}"))
                    .body(())
                    .expect("request");
                let sent = send
                    .ready()
                    .await
                    .and_then(|mut s| s.send_request(request, true));
                match sent {
                    Ok((response, _)) => response.await.is_err(),
                    Err(_) => true,
                }
            })
        });
        assert!(refused.join().expect("client"), "h2 answered without h2c");
    }
}
