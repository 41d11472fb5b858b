//! `llm-gateway bodylog-listen`: receives body-log frames over TCP and
//! writes one JSON record per request into hourly files
//! (`<dir>/YYYYMMDD-HH.jsonl`, UTC, by the time a frame arrives), and
//! optionally serves the exporter's `/metrics`.
//!
//! Threads: connection tasks (tokio) cut frames and build records; one
//! writer thread owns the files, so disk writes never stall a socket read
//! and records keep their arrival order. Lines are buffered and flushed
//! every second; a file is fsynced when the hour turns and at shutdown.
//!
//! SIGTERM (or SIGINT): stop accepting, read every connection until it has
//! been quiet for [`DRAIN_QUIET`] (a gateway never closes its side), for at
//! most [`DRAIN_MAX`] (a busy gateway is never quiet), write what arrived,
//! fsync, exit 0. Only a frame still incomplete at that point is lost
//! (logged).

use super::export::Exporter;
use super::frame::{decode, MAX_FRAME};
use super::record::{self, Record};
use bytes::{Buf, BytesMut};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// How long a connection must stay quiet during shutdown before it is
/// considered drained.
pub const DRAIN_QUIET: Duration = Duration::from_millis(300);
pub const DRAIN_MAX: Duration = Duration::from_secs(5);
const FLUSH_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct ListenConfig {
    pub listen: String,
    pub dir: PathBuf,
    pub metrics: Option<String>,
}

/// `YYYYMMDD-HH.jsonl` of the UTC hour `t` falls in.
pub fn hour_file_name(t: SystemTime) -> String {
    // "2024-01-02T03:04:05Z": fixed positions for years 0000-9999.
    let s = humantime::format_rfc3339_seconds(t).to_string();
    format!("{}{}{}-{}.jsonl", &s[0..4], &s[5..7], &s[8..10], &s[11..13])
}

/// The hourly files, rotated by the time each write is given: the clock is
/// the caller's, so tests choose the hour.
pub struct HourlyFiles {
    dir: PathBuf,
    current: Option<(String, BufWriter<File>)>,
}

impl HourlyFiles {
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(HourlyFiles {
            dir: dir.to_path_buf(),
            current: None,
        })
    }

    /// Appends `line` and a newline to the file of `now`'s hour; a new hour
    /// closes (flush + fsync) the previous file first. An existing file is
    /// appended to, never truncated (a restarted listener).
    pub fn write(&mut self, now: SystemTime, line: &[u8]) -> std::io::Result<()> {
        let name = hour_file_name(now);
        if self.current.as_ref().is_none_or(|(n, _)| *n != name) {
            self.close()?;
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(&name))?;
            // The new file's directory entry survives a crash too (once an
            // hour; a failure here loses nothing yet).
            let _ = File::open(&self.dir).and_then(|d| d.sync_all());
            self.current = Some((name, BufWriter::with_capacity(256 << 10, file)));
        }
        if let Some((_, w)) = self.current.as_mut() {
            w.write_all(line)?;
            w.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Makes buffered lines visible to readers (no fsync).
    pub fn flush(&mut self) -> std::io::Result<()> {
        match self.current.as_mut() {
            Some((_, w)) => w.flush(),
            None => Ok(()),
        }
    }

    /// Flushes and fsyncs the open file, if any.
    pub fn close(&mut self) -> std::io::Result<()> {
        if let Some((_, mut w)) = self.current.take() {
            w.flush()?;
            w.get_ref().sync_all()?;
        }
        Ok(())
    }

    pub fn current(&self) -> Option<&str> {
        self.current.as_ref().map(|(n, _)| n.as_str())
    }
}

enum Msg {
    Record(Box<Record>),
    Flush,
}

/// Runs the listener until SIGTERM / SIGINT; the process exit code.
pub fn run(config: ListenConfig) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

async fn serve(config: ListenConfig) -> Result<(), String> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("signals: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("signals: {e}"))?;
    let files =
        HourlyFiles::new(&config.dir).map_err(|e| format!("{}: {e}", config.dir.display()))?;
    let listener = TcpListener::bind(&config.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", config.listen))?;
    let exporter = Arc::new(Exporter::new());
    let metrics = match &config.metrics {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| format!("metrics on {addr}: {e}"))?,
        ),
        None => None,
    };
    // Records can be megabytes each: a short queue, whose backpressure
    // reaches the gateway (which drops rather than waits).
    let (tx, rx) = mpsc::channel::<Msg>(64);
    let writer = {
        let exporter = Arc::clone(&exporter);
        std::thread::Builder::new()
            .name("bodylog-writer".into())
            .spawn(move || write_loop(files, rx, SystemTime::now, &exporter))
            .map_err(|e| format!("writer thread: {e}"))?
    };
    let (stop_tx, stop) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tasks.spawn(accept_loop(
        listener,
        tx.clone(),
        Arc::clone(&exporter),
        stop.clone(),
    ));
    tasks.spawn(flush_ticker(tx, stop.clone()));
    if let Some(m) = metrics {
        tasks.spawn(metrics_loop(m, Arc::clone(&exporter), stop.clone()));
    }
    log::info!(
        "bodylog listener on {}, writing {}{}",
        config.listen,
        config.dir.display(),
        config
            .metrics
            .as_deref()
            .map(|m| format!(", metrics on {m}"))
            .unwrap_or_default()
    );
    tokio::select! {
        _ = term.recv() => log::info!("SIGTERM: draining connections"),
        _ = int.recv() => log::info!("SIGINT: draining connections"),
    }
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    // Every sender is gone: the writer writes what is left, fsyncs, ends.
    match tokio::task::spawn_blocking(move || writer.join()).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(format!("writing records: {e}")),
        _ => Err("the writer thread failed".into()),
    }
}

/// The writer thread: records into files (and the exporter, so its counts
/// are those of the files), flushes on ticks, closes when every sender is
/// gone.
fn write_loop(
    mut files: HourlyFiles,
    mut rx: mpsc::Receiver<Msg>,
    clock: impl Fn() -> SystemTime,
    exporter: &Exporter,
) -> std::io::Result<()> {
    let mut failed: Option<std::io::Error> = None;
    while let Some(msg) = rx.blocking_recv() {
        let result = match msg {
            Msg::Record(rec) => files.write(clock(), &rec.line).map(|()| {
                exporter.observe(&rec.summary);
            }),
            Msg::Flush => files.flush(),
        };
        if let Err(e) = result {
            log::error!("bodylog: writing {:?}: {e}", files.current());
            failed = Some(e);
        }
    }
    files.close()?;
    failed.map_or(Ok(()), Err)
}

/// Resolves once the stop signal is given (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn flush_ticker(tx: mpsc::Sender<Msg>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if tx.send(Msg::Flush).await.is_err() {
                    return;
                }
            }
            () = stopped(&mut stop) => return,
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    tx: mpsc::Sender<Msg>,
    exporter: Arc<Exporter>,
    mut stop: watch::Receiver<bool>,
) {
    let for_conns = stop.clone();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    log::info!("bodylog: connection from {peer}");
                    conns.spawn(read_frames(stream, tx.clone(), Arc::clone(&exporter), for_conns.clone()));
                }
                Err(e) => log::warn!("bodylog: accept: {e}"),
            },
            () = stopped(&mut stop) => break,
            // Reap finished connections as they go.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// Reads frames until the peer closes, the stream is not body-log frames,
/// or (after the stop signal) the connection has been quiet a while.
async fn read_frames(
    mut stream: TcpStream,
    tx: mpsc::Sender<Msg>,
    exporter: Arc<Exporter>,
    mut stop: watch::Receiver<bool>,
) {
    let mut buf = BytesMut::with_capacity(256 << 10);
    let mut drain_until: Option<tokio::time::Instant> = None;
    loop {
        let read = if let Some(until) = drain_until {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            match tokio::time::timeout(DRAIN_QUIET.min(left), stream.read_buf(&mut buf)).await {
                Ok(r) => r,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                r = stream.read_buf(&mut buf) => r,
                () = stopped(&mut stop) => {
                    drain_until = Some(tokio::time::Instant::now() + DRAIN_MAX);
                    continue;
                }
            }
        };
        match read {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                log::warn!("bodylog: read: {e}");
                break;
            }
        }
        match take_frames(&mut buf, SystemTime::now()) {
            Ok(records) => {
                for rec in records {
                    match rec {
                        Ok(rec) => {
                            if tx.send(Msg::Record(Box::new(rec))).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            log::warn!("bodylog: bad frame: {e}");
                            exporter.bad_frame();
                        }
                    }
                }
            }
            Err(e) => {
                log::warn!("bodylog: {e}; closing the connection");
                exporter.bad_frame();
                return;
            }
        }
    }
    if !buf.is_empty() {
        log::warn!(
            "bodylog: connection ended inside a frame ({} bytes lost)",
            buf.len()
        );
    }
}

/// Every complete frame at the front of `buf`, as records (a frame whose
/// meta is unusable is an `Err` item; the stream goes on). `Err` when the
/// length prefix is impossible: the stream is not frames, or out of step.
fn take_frames(buf: &mut BytesMut, now: SystemTime) -> Result<Vec<Result<Record, String>>, String> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len > MAX_FRAME {
            return Err(format!(
                "frame of {len} bytes is over the {MAX_FRAME}-byte limit"
            ));
        }
        if buf.len() < 4 + len {
            buf.reserve(4 + len - buf.len());
            break;
        }
        buf.advance(4);
        let body = buf.split_to(len);
        out.push(
            decode(&body)
                .map_err(|e| e.to_string())
                .and_then(|f| record::build(&f, now)),
        );
    }
    Ok(out)
}

/// A tiny HTTP/1.1 server: `GET /metrics`, `GET /healthz`, one request per
/// connection.
async fn metrics_loop(
    listener: TcpListener,
    exporter: Arc<Exporter>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    tokio::spawn(answer_metrics(stream, Arc::clone(&exporter)));
                }
            }
            () = stopped(&mut stop) => return,
        }
    }
}

async fn answer_metrics(mut stream: TcpStream, exporter: Arc<Exporter>) {
    let mut head = Vec::with_capacity(1024);
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        true
    })
    .await;
    if read != Ok(true) {
        return;
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or(&[]);
    let path = line.split(|&b| b == b' ').nth(1).unwrap_or(&[]);
    let (status, ctype, body) = match path {
        b"/metrics" => ("200 OK", "text/plain; version=0.0.4", exporter.encode()),
        b"/healthz" => ("200 OK", "text/plain", b"ok\n".to_vec()),
        _ => (
            "404 Not Found",
            "text/plain",
            b"/metrics, /healthz\n".to_vec(),
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    let _ = stream.write_all(&out).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::super::frame::Frame;
    use super::*;
    use bytes::Bytes;

    fn at(rfc3339: &str) -> SystemTime {
        humantime::parse_rfc3339(rfc3339).unwrap()
    }

    fn lines(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    #[test]
    fn file_names_are_the_utc_hour() {
        assert_eq!(
            hour_file_name(at("2024-01-02T03:59:59.999Z")),
            "20240102-03.jsonl"
        );
        assert_eq!(
            hour_file_name(at("2024-12-31T23:00:00Z")),
            "20241231-23.jsonl"
        );
        assert_eq!(hour_file_name(SystemTime::UNIX_EPOCH), "19700101-00.jsonl");
    }

    /// The hour turning closes the old file with everything in it (before
    /// the new file is even flushed), and the same hour appends.
    #[test]
    fn rotation_follows_the_injected_clock() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = HourlyFiles::new(dir.path()).unwrap();
        files.write(at("2024-01-02T03:59:58Z"), b"a").unwrap();
        files.write(at("2024-01-02T03:59:59Z"), b"b").unwrap();
        assert_eq!(files.current(), Some("20240102-03.jsonl"));
        let old = dir.path().join("20240102-03.jsonl");
        assert!(lines(&old).is_empty(), "buffered until flush or rotation");
        files.write(at("2024-01-02T04:00:00Z"), b"c").unwrap();
        assert_eq!(files.current(), Some("20240102-04.jsonl"));
        assert_eq!(lines(&old), ["a", "b"], "rotation flushed the old hour");
        let new = dir.path().join("20240102-04.jsonl");
        assert!(lines(&new).is_empty());
        files.close().unwrap();
        assert_eq!(lines(&new), ["c"]);
        // A restarted listener appends to the hour's file.
        let mut again = HourlyFiles::new(dir.path()).unwrap();
        again.write(at("2024-01-02T04:30:00Z"), b"d").unwrap();
        again.close().unwrap();
        assert_eq!(lines(&new), ["c", "d"]);
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["20240102-03.jsonl", "20240102-04.jsonl"]);
    }

    /// The writer thread, on an injected clock: records land in their
    /// hour's file and in the exporter, and a closed channel closes files.
    #[test]
    fn write_loop_rotates_on_its_clock_and_counts_what_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let files = HourlyFiles::new(dir.path()).unwrap();
        let (tx, rx) = mpsc::channel(16);
        let times =
            std::sync::Mutex::new(vec![at("2024-05-01T10:00:01Z"), at("2024-05-01T09:59:59Z")]);
        let clock = move || times.lock().unwrap().pop().unwrap();
        let exporter = Exporter::new();
        let meta = br#"{"route":"r","status":200}"#;
        for _ in 0..2 {
            let wire = Frame::new(meta.to_vec(), Bytes::new(), Bytes::new()).to_vec();
            let rec = record::build(&decode(&wire[4..]).unwrap(), SystemTime::UNIX_EPOCH).unwrap();
            tx.blocking_send(Msg::Record(Box::new(rec))).unwrap();
        }
        drop(tx);
        write_loop(files, rx, clock, &exporter).unwrap();
        assert_eq!(lines(&dir.path().join("20240501-09.jsonl")).len(), 1);
        assert_eq!(lines(&dir.path().join("20240501-10.jsonl")).len(), 1);
        let text = String::from_utf8(exporter.encode()).unwrap();
        assert!(
            text.contains("llm_bodylog_records_total{result=\"written\"} 2"),
            "{text}"
        );
    }

    #[test]
    fn frames_are_cut_from_a_byte_stream_however_it_arrives() {
        let wire: Vec<u8> = (0..3u8)
            .flat_map(|n| {
                Frame::new(
                    format!("{{\"n\":{n}}}").into_bytes(),
                    Bytes::from(vec![b'q'; 10]),
                    Bytes::new(),
                )
                .to_vec()
            })
            .collect();
        for step in [1, 5, wire.len()] {
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for piece in wire.chunks(step) {
                buf.extend_from_slice(piece);
                got.extend(take_frames(&mut buf, SystemTime::UNIX_EPOCH).unwrap());
            }
            assert_eq!(got.len(), 3, "pieces of {step}");
            assert!(buf.is_empty());
        }
        let mut bad = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
        assert!(take_frames(&mut bad, SystemTime::UNIX_EPOCH).is_err());
    }
}
