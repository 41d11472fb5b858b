//! Reload on change (`watch: true` in gateway.yaml): inotify, through the
//! `notify` crate, on `routes_dir` and on the directory of every API key
//! file. A burst of changes becomes one message to the controller, which
//! runs the very reload SIGHUP runs (`Controller::reload`).
//!
//! Directories are watched, not files: an editor or `mv` replaces a file by
//! rename (a new inode, which a watch on the old one never hears of), and a
//! Kubernetes ConfigMap or Secret volume changes by renaming a fresh
//! `..data` symlink over the old one, which shows only as a rename in the
//! volume's own directory. Changes are debounced so a writer's burst is one
//! reload; a file still half-written when a reload runs fails to parse and
//! keeps its previous version (as on SIGHUP), and the writes that finish it
//! trigger the reload that loads it.
//!
//! Three parts: the watcher's thread filters events (route files, key
//! files, the `..data` link; it never reads a file), a debounce task
//! folds a burst into one [`Burst`], and the controller's loop reloads on
//! it, then hands the watch the new table's key files ([`ConfigWatch::sync`]
//! with `Registry::key_files`). The watch never touches the registry.

use crate::metrics::metrics;
use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
use notify::{Event, RecommendedWatcher, RecursiveMode, Watcher};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Quiet time after the last change before the reload runs.
pub const DEBOUNCE: Duration = Duration::from_millis(500);
/// A writer that never pauses still gets a reload this often.
pub const MAX_DELAY: Duration = Duration::from_secs(5);
/// How often a directory that could not be watched (missing, inotify limit)
/// is tried again.
pub const RETRY: Duration = Duration::from_secs(5);

/// What Kubernetes' atomic writer renames into a ConfigMap or Secret volume
/// to publish a new version; the visible files are symlinks through it.
const K8S_DATA: &str = "..data";

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Interest {
    /// Every route file (`*.yaml`, `*.yml`) in the directory matters.
    route_files: bool,
    /// Key files by name.
    names: BTreeSet<OsString>,
}

/// The directories to watch and, in each, the names whose change a reload
/// would read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Targets {
    routes_dir: PathBuf,
    dirs: BTreeMap<PathBuf, Interest>,
}

/// Paths are compared as given (the watcher reports the watched path joined
/// with the entry's name), so a bare file name's directory is `.`, the way
/// it is watched.
fn dir_of(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

impl Targets {
    pub fn new(routes_dir: &Path, key_files: &[PathBuf]) -> Self {
        let mut dirs: BTreeMap<PathBuf, Interest> = BTreeMap::new();
        dirs.entry(routes_dir.to_path_buf())
            .or_default()
            .route_files = true;
        for file in key_files {
            if let Some(name) = file.file_name() {
                dirs.entry(dir_of(file))
                    .or_default()
                    .names
                    .insert(name.to_owned());
            }
        }
        Targets {
            routes_dir: routes_dir.to_path_buf(),
            dirs,
        }
    }

    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.dirs.keys().map(PathBuf::as_path)
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.dirs.contains_key(path)
    }

    /// Whether `dir` is watched for key files alone (no route files).
    pub fn only_key_files(&self, dir: &Path) -> bool {
        self.dirs.get(dir).is_some_and(|i| !i.route_files)
    }

    /// Whether a change at `path` can change what a reload reads.
    pub fn concerns(&self, path: &Path) -> bool {
        // A watched directory itself removed or moved away.
        if self.is_dir(path) {
            return true;
        }
        let Some(name) = path.file_name() else {
            return false;
        };
        let Some(interest) = self.dirs.get(&dir_of(path)) else {
            return false;
        };
        name == K8S_DATA
            || interest.names.contains(name)
            || (interest.route_files && crate::config::route_name_of(path).is_some())
    }
}

/// Writes, creations, removals, renames, attribute changes: not reads. The
/// reload's own reads of the files must never trigger another reload.
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// One relevant filesystem event.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Change {
    paths: Vec<PathBuf>,
    /// The kernel dropped events (queue overflow): anything may have changed.
    rescan: bool,
    /// Watched directories that were removed or moved away: their watch is gone.
    lost: Vec<PathBuf>,
}

fn relevant(targets: &Targets, event: &Event) -> Option<Change> {
    if event.need_rescan() {
        return Some(Change {
            rescan: true,
            ..Change::default()
        });
    }
    if !is_change(&event.kind) {
        return None;
    }
    let paths: Vec<PathBuf> = event
        .paths
        .iter()
        .filter(|p| targets.concerns(p))
        .cloned()
        .collect();
    if paths.is_empty() {
        return None;
    }
    let gone = matches!(
        event.kind,
        EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
    );
    let lost = if gone {
        paths
            .iter()
            .filter(|p| targets.is_dir(p))
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    Some(Change {
        paths,
        rescan: false,
        lost,
    })
}

/// The changes one reload answers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Burst {
    pub paths: BTreeSet<PathBuf>,
    pub rescan: bool,
    /// Events folded into this burst.
    pub events: usize,
}

impl Burst {
    fn add(&mut self, change: Change) {
        self.paths.extend(change.paths);
        self.rescan |= change.rescan;
        self.events += 1;
    }
}

impl fmt::Display for Burst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 4;
        let mut names: Vec<String> = self
            .paths
            .iter()
            .take(SHOWN)
            .map(|p| p.display().to_string())
            .collect();
        if self.paths.len() > SHOWN {
            names.push(format!("{} more", self.paths.len() - SHOWN));
        }
        if self.rescan {
            names.push("events lost, rescanning".into());
        }
        write!(f, "{} ({} events)", names.join(", "), self.events)
    }
}

/// Folds changes until `quiet` passes without one (or `max` since the
/// first), then hands the burst on.
async fn debounce(
    mut raw: mpsc::UnboundedReceiver<Change>,
    out: mpsc::Sender<Burst>,
    quiet: Duration,
    max: Duration,
) {
    while let Some(first) = raw.recv().await {
        let mut burst = Burst::default();
        burst.add(first);
        let started = tokio::time::Instant::now();
        loop {
            let left = max.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            match tokio::time::timeout(quiet.min(left), raw.recv()).await {
                Ok(Some(change)) => burst.add(change),
                Ok(None) | Err(_) => break,
            }
        }
        if out.send(burst).await.is_err() {
            return;
        }
    }
}

/// The live watch. Owned by the controller; dropping it stops the watch.
pub struct ConfigWatch {
    watcher: RecommendedWatcher,
    /// Read by the watcher's thread to filter events.
    targets: Arc<RwLock<Targets>>,
    /// Directories whose watch the watcher's thread saw go away.
    lost: Arc<Mutex<BTreeSet<PathBuf>>>,
    watched: BTreeSet<PathBuf>,
    /// Directories that could not be watched (logged once, retried).
    failed: BTreeSet<PathBuf>,
}

impl ConfigWatch {
    /// Starts the OS watcher and the debouncer (on the current tokio
    /// runtime). Fails only when the watcher itself cannot start (e.g. the
    /// inotify instance limit); a directory that cannot be watched is logged
    /// and retried instead.
    pub fn start(targets: Targets) -> notify::Result<(ConfigWatch, mpsc::Receiver<Burst>)> {
        let shared = Arc::new(RwLock::new(targets.clone()));
        let lost = Arc::new(Mutex::new(BTreeSet::new()));
        let (raw_tx, raw_rx) = mpsc::unbounded_channel();
        let watcher = {
            let shared = Arc::clone(&shared);
            let lost = Arc::clone(&lost);
            notify::recommended_watcher(move |result: notify::Result<Event>| match result {
                Ok(event) => {
                    let Some(change) = relevant(&shared.read(), &event) else {
                        return;
                    };
                    // Recorded before the change is sent, so the sync after
                    // the reload it triggers sees it.
                    lost.lock().extend(change.lost.iter().cloned());
                    let _ = raw_tx.send(change);
                }
                Err(e) => log::warn!("config watch: {e}"),
            })?
        };
        // One burst waits while a reload runs; later changes fold into the next.
        let (burst_tx, burst_rx) = mpsc::channel(1);
        tokio::spawn(debounce(raw_rx, burst_tx, DEBOUNCE, MAX_DELAY));
        let mut watch = ConfigWatch {
            watcher,
            targets: shared,
            lost,
            watched: BTreeSet::new(),
            failed: BTreeSet::new(),
        };
        watch.sync(targets);
        Ok((watch, burst_rx))
    }

    /// Follows the targets of the table just loaded: watches what is new or
    /// was lost, stops watching what no reload reads any more. True when a
    /// directory that should have been watched (it had failed, or its watch
    /// was lost) is watched again: what changed there meanwhile was not
    /// seen, so the caller reloads.
    pub fn sync(&mut self, targets: Targets) -> bool {
        for dir in std::mem::take(&mut *self.lost.lock()) {
            if self.watched.remove(&dir) {
                // The kernel has dropped it already; this only tidies up.
                let _ = self.watcher.unwatch(&dir);
                self.failed.insert(dir);
            }
        }
        let want: BTreeSet<PathBuf> = targets.dirs().map(Path::to_path_buf).collect();
        for gone in self.watched.difference(&want).cloned().collect::<Vec<_>>() {
            let _ = self.watcher.unwatch(&gone);
            self.watched.remove(&gone);
        }
        self.failed.retain(|d| want.contains(d));
        let mut regained = false;
        for dir in want.difference(&self.watched).cloned().collect::<Vec<_>>() {
            match self.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    if self.failed.remove(&dir) {
                        log::info!("config watch: watching {} again", dir.display());
                        regained = true;
                    }
                    self.watched.insert(dir);
                }
                Err(e) => {
                    if !self.failed.insert(dir.clone()) {
                        continue;
                    }
                    if matches!(e.kind, notify::ErrorKind::PathNotFound)
                        && targets.only_key_files(&dir)
                    {
                        // Its key files are missing too, which their load
                        // reported already (at ERROR where keys are
                        // expected): one state, one line. The retry picks
                        // the directory up once it exists.
                        log::debug!(
                            "config watch: {} does not exist; watched once it does (retried every {RETRY:?})",
                            dir.display()
                        );
                    } else {
                        log::error!(
                            "config watch: cannot watch {} ({e}); changes there need SIGHUP until it can be watched (retried every {RETRY:?})",
                            dir.display()
                        );
                    }
                }
            }
        }
        let routes_watched = self.watched.contains(&targets.routes_dir);
        metrics().watching.set(i64::from(routes_watched));
        *self.targets.write() = targets;
        regained
    }

    /// Whether some directory waits for a retry.
    pub fn incomplete(&self) -> bool {
        !self.failed.is_empty() || !self.lost.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, DataChange, RemoveKind, RenameMode};

    fn targets() -> Targets {
        Targets::new(
            Path::new("/cfg/routes"),
            &[
                PathBuf::from("/cfg/keys/api-keys"),
                PathBuf::from("/other/route-keys"),
                PathBuf::from("bare-keys"),
            ],
        )
    }

    #[test]
    fn only_route_files_key_files_and_the_data_link_concern_a_reload() {
        let t = targets();
        for yes in [
            "/cfg/routes/chat.yaml",
            "/cfg/routes/chat.yml",
            "/cfg/routes/..data",
            "/cfg/keys/api-keys",
            "/cfg/keys/..data",
            "/other/route-keys",
            "./bare-keys",
            "/cfg/routes",
        ] {
            assert!(t.concerns(Path::new(yes)), "{yes}");
        }
        for no in [
            "/cfg/routes/..data_tmp",
            "/cfg/routes/..2026_12_01_00_00_00.123",
            "/cfg/routes/.chat.yaml.swp",
            "/cfg/routes/README",
            "/cfg/routes/sub/chat.yaml",
            "/cfg/keys/other-file",
            "/cfg/keys/chat.yaml",
            "/other/api-keys",
            "/cfg",
        ] {
            assert!(!t.concerns(Path::new(no)), "{no}");
        }
        let dirs: BTreeSet<&Path> = t.dirs().collect();
        assert_eq!(
            dirs,
            BTreeSet::from([".", "/cfg/keys", "/cfg/routes", "/other"].map(Path::new))
        );
    }

    fn event(kind: EventKind, path: &str) -> Event {
        Event::new(kind).add_path(PathBuf::from(path))
    }

    #[test]
    fn reads_are_ignored_and_writes_renames_and_removals_count() {
        let t = targets();
        let chat = "/cfg/routes/chat.yaml";
        for read in [
            AccessKind::Open(AccessMode::Read),
            AccessKind::Close(AccessMode::Read),
            AccessKind::Read,
        ] {
            assert_eq!(relevant(&t, &event(EventKind::Access(read), chat)), None);
        }
        for change in [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Remove(RemoveKind::File),
        ] {
            let c = relevant(&t, &event(change, chat)).expect("counts");
            assert_eq!(c.paths, vec![PathBuf::from(chat)]);
            assert!(c.lost.is_empty());
        }
        // Control: the same write to an unrelated file is not a change.
        assert_eq!(
            relevant(
                &t,
                &event(
                    EventKind::Modify(ModifyKind::Data(DataChange::Any)),
                    "/cfg/routes/notes.txt"
                )
            ),
            None
        );
        // The kubelet's swap: `..data_tmp` renamed over `..data`.
        let swap = Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
            .add_path(PathBuf::from("/cfg/keys/..data_tmp"))
            .add_path(PathBuf::from("/cfg/keys/..data"));
        let c = relevant(&t, &swap).expect("the swap counts");
        assert_eq!(c.paths, vec![PathBuf::from("/cfg/keys/..data")]);
        // A watched directory removed: its watch is lost.
        let c = relevant(
            &t,
            &event(EventKind::Remove(RemoveKind::Folder), "/cfg/routes"),
        )
        .expect("counts");
        assert_eq!(c.lost, vec![PathBuf::from("/cfg/routes")]);
        // Dropped events: reload whatever they were.
        let overflow = Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan);
        assert!(relevant(&t, &overflow).expect("rescan").rescan);
    }

    fn change(path: &str) -> Change {
        Change {
            paths: vec![PathBuf::from(path)],
            ..Change::default()
        }
    }

    #[tokio::test]
    async fn a_burst_is_one_message_and_a_later_change_another() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (out_tx, mut out) = mpsc::channel(1);
        // Queued before the debouncer runs: all of them are one burst
        // whatever the scheduling.
        for name in ["a.yaml", "b.yaml", "a.yaml", "a.yaml"] {
            tx.send(change(&format!("/r/{name}"))).unwrap();
        }
        tokio::spawn(debounce(
            rx,
            out_tx,
            Duration::from_millis(50),
            Duration::from_secs(10),
        ));
        let first = out.recv().await.expect("one burst");
        assert_eq!(first.events, 4);
        assert_eq!(first.paths.len(), 2);
        // Control: a change after the burst went out is a burst of its own.
        tx.send(change("/r/c.yaml")).unwrap();
        let second = out.recv().await.expect("second burst");
        assert_eq!(second.events, 1);
        assert!(second.paths.contains(Path::new("/r/c.yaml")));
        drop(tx);
        assert_eq!(out.recv().await, None, "ends with its input");
    }

    #[tokio::test]
    async fn a_writer_that_never_pauses_still_gets_a_reload_after_max_delay() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (out_tx, mut out) = mpsc::channel(1);
        // Quiet never comes (a change every 10 ms, quiet 1 h): only the
        // max delay can end the burst.
        tokio::spawn(debounce(
            rx,
            out_tx,
            Duration::from_secs(3600),
            Duration::from_millis(200),
        ));
        let feeder = tokio::spawn(async move {
            loop {
                if tx.send(change("/r/a.yaml")).is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let burst = tokio::time::timeout(Duration::from_secs(20), out.recv())
            .await
            .expect("max delay ends the burst")
            .expect("a burst");
        assert!(burst.events >= 1);
        feeder.abort();
    }
}
