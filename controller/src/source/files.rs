//! The manifest-directory source: reads, watches and reloads `--manifests DIR`.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file below DIR (hidden files and folders, such as the
//! `..data` links of a mounted ConfigMap, are skipped) is parsed into Kubernetes objects. Each
//! file's last good parse is kept: a file that stops parsing is reported (file, line, reason) and
//! its previous objects keep serving, so one typo never drops routes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use super::manifest::{self, ManifestError};
use crate::snapshot::{Object, SharedObject, Snapshot, SnapshotKey};

/// Errors of the file source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The manifest directory cannot be listed.
    #[error("cannot read manifest directory {path}: {source}")]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file watcher could not be set up.
    #[error("cannot watch {path}: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The watcher's error.
        source: notify::Error,
    },
}

/// A `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A file that could not be read or parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line of the problem, where known.
    pub line: Option<usize>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.path.display(), line, self.reason),
            None => write!(f, "{}: {}", self.path.display(), self.reason),
        }
    }
}

impl FileError {
    fn from_manifest(path: &Path, err: &ManifestError) -> Self {
        FileError { path: path.to_path_buf(), line: err.line(), reason: err.reason().to_string() }
    }
}

/// What one file contributed at its last successful parse.
#[derive(Debug)]
struct FileState {
    /// What identifies the file's current version without reading it: a cheap change check.
    stamp: Stamp,
    /// Hash of the content last read, parsed or not, to skip reparsing unchanged files (the
    /// bytes themselves are not kept); `None` when the last read failed.
    hash: Option<u64>,
    /// Objects of the last good parse (empty if the file never parsed), kinds weir reads only.
    objects: Vec<SharedObject>,
    /// The current error, if the newest content does not parse.
    error: Option<FileError>,
}

/// Modification and change times, length and inode of a file. A rewrite changes at least one
/// of them even within one tick of the filesystem clock (a replaced file is a new inode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    changed: (i64, i64),
    len: u64,
    inode: (u64, u64),
}

impl Stamp {
    fn of(path: &Path) -> Stamp {
        match std::fs::metadata(path) {
            Ok(meta) => Stamp::from_meta(&meta),
            Err(_) => Stamp::default(),
        }
    }

    #[cfg(unix)]
    fn from_meta(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            modified: meta.modified().ok(),
            changed: (meta.ctime(), meta.ctime_nsec()),
            len: meta.len(),
            inode: (meta.dev(), meta.ino()),
        }
    }

    #[cfg(not(unix))]
    fn from_meta(meta: &std::fs::Metadata) -> Stamp {
        Stamp { modified: meta.modified().ok(), len: meta.len(), ..Stamp::default() }
    }
}

fn content_hash(content: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    content.hash(&mut hasher);
    hasher.finish()
}

/// The state of a manifest directory: every file's last good objects and current errors, and
/// the snapshot they make, kept up to date file by file.
#[derive(Debug)]
pub struct ManifestDir {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    /// Every file's objects, the later file winning where two define one object.
    snapshot: Snapshot,
    /// Objects defined more than once, with one message per definition that replaced another.
    duplicates: BTreeMap<SnapshotKey, Vec<String>>,
    /// Keys whose object in `snapshot` changed since [`ManifestDir::take_changes`].
    changes: BTreeSet<SnapshotKey>,
}

/// The outcome of a (re)scan.
#[derive(Debug, Default)]
pub struct Scan {
    /// Whether any file's objects changed (a new snapshot should be translated).
    pub changed: bool,
}

/// Which files a scan reads.
#[derive(Clone, Copy)]
enum Read<'a> {
    /// Every file, comparing content.
    All,
    /// Files whose [`Stamp`] changed, and these.
    Changed(&'a BTreeSet<PathBuf>),
}

impl ManifestDir {
    /// A source for `root`; nothing is read until [`ManifestDir::rescan`].
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ManifestDir {
            root: root.into(),
            files: BTreeMap::new(),
            snapshot: Snapshot::default(),
            duplicates: BTreeMap::new(),
            changes: BTreeSet::new(),
        }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Re-reads the directory. With `force`, every file's content is compared; without it, only
    /// files whose modification time, length or inode changed (a cheap poll).
    pub fn rescan(&mut self, force: bool) -> Result<Scan> {
        static NONE: BTreeSet<PathBuf> = BTreeSet::new();
        self.scan(if force { Read::All } else { Read::Changed(&NONE) })
    }

    /// Re-reads the files a watcher reported (`paths`, whatever their stamps say) and those
    /// whose stamp changed; the rest of the directory is only listed.
    pub fn rescan_paths(&mut self, paths: &BTreeSet<PathBuf>) -> Result<Scan> {
        self.scan(Read::Changed(paths))
    }

    fn scan(&mut self, read: Read<'_>) -> Result<Scan> {
        let paths = list_files(&self.root)?;
        let mut scan = Scan::default();
        let gone: Vec<PathBuf> = self.files.keys().filter(|p| !paths.contains(p)).cloned().collect();
        for path in gone {
            if let Some(state) = self.files.remove(&path) {
                self.replace_objects(state.objects, &[]);
                scan.changed = true;
            }
        }
        for path in paths {
            let stamp = Stamp::of(&path);
            if let (Some(state), Read::Changed(notified)) = (self.files.get(&path), read)
                && state.stamp == stamp
                && !notified.contains(&path)
            {
                continue;
            }
            let content = match std::fs::read(&path) {
                Ok(c) => c,
                Err(e) => {
                    // Vanished between listing and reading, or unreadable: report, keep objects.
                    let error = FileError { path: path.clone(), line: None, reason: e.to_string() };
                    let state = self.files.entry(path.clone()).or_insert_with(|| FileState {
                        stamp,
                        hash: None,
                        objects: Vec::new(),
                        error: None,
                    });
                    state.hash = None;
                    if state.error.as_ref() != Some(&error) {
                        tracing::warn!(%error, "manifest file unreadable; keeping its last good objects");
                    }
                    state.error = Some(error);
                    continue;
                }
            };
            let hash = content_hash(&content);
            if let Some(state) = self.files.get_mut(&path)
                && state.hash == Some(hash)
            {
                // The bytes last read: parsed then, or failing to parse the same way.
                state.stamp = stamp;
                continue;
            }
            let parsed = std::str::from_utf8(&content)
                .map_err(|e| FileError { path: path.clone(), line: None, reason: format!("not UTF-8: {e}") })
                .and_then(|text| {
                    manifest::parse_manifests(text).map_err(|e| FileError::from_manifest(&path, &e))
                });
            drop(content);
            let state = self.files.entry(path.clone()).or_insert_with(|| FileState {
                stamp,
                hash: None,
                objects: Vec::new(),
                error: None,
            });
            state.stamp = stamp;
            state.hash = Some(hash);
            match parsed {
                Ok(objects) => {
                    if state.error.take().is_some() {
                        tracing::info!(path = %path.display(), "manifest file parses again");
                    }
                    let new = share_unchanged(&state.objects, objects);
                    let old = std::mem::replace(&mut state.objects, new.clone());
                    if self.replace_objects(old, &new) {
                        scan.changed = true;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "manifest file does not parse; keeping its last good objects");
                    state.error = Some(error);
                }
            }
        }
        Ok(scan)
    }

    /// Brings the snapshot up to date after the objects of one file went from `old` to `new`
    /// (`self.files` already holds `new`, or no longer has the file). True if the snapshot
    /// changed.
    fn replace_objects(&mut self, old: Vec<SharedObject>, new: &[SharedObject]) -> bool {
        let old_keys: BTreeMap<SnapshotKey, &SharedObject> = old.iter().map(|o| (o.key(), o)).collect();
        let mut new_keys: BTreeMap<SnapshotKey, &SharedObject> = BTreeMap::new();
        // Keys whose winner must be found by looking at every file (defined more than once).
        let mut contested = BTreeSet::new();
        for object in new {
            let key = object.key();
            if new_keys.insert(key.clone(), object).is_some() {
                contested.insert(key);
            }
        }
        let mut changed = false;
        for (key, object) in &new_keys {
            let ours = old_keys.contains_key(key);
            if contested.contains(key)
                || self.duplicates.contains_key(key)
                || (!ours && self.snapshot.get(key).is_some())
            {
                contested.insert(key.clone());
                continue;
            }
            if old_keys.get(key).is_some_and(|o| o.same(object)) {
                continue;
            }
            self.snapshot.insert_shared(key.clone(), (*object).clone());
            self.changes.insert(key.clone());
            changed = true;
        }
        for key in old_keys.keys().filter(|k| !new_keys.contains_key(*k)) {
            if self.duplicates.contains_key(key) {
                contested.insert(key.clone());
                continue;
            }
            self.snapshot.remove(key);
            self.changes.insert(key.clone());
            changed = true;
        }
        if !contested.is_empty() {
            changed |= self.settle(&contested);
        }
        changed
    }

    /// Finds the definition of each of `keys` that wins (the last, in file order) and the
    /// duplicates, looking at every file. True if the snapshot changed.
    fn settle(&mut self, keys: &BTreeSet<SnapshotKey>) -> bool {
        let mut definitions: BTreeMap<&SnapshotKey, Vec<(&Path, &SharedObject)>> = BTreeMap::new();
        for (path, state) in &self.files {
            for object in &state.objects {
                let key = object.key();
                if let Some(key) = keys.get(&key) {
                    definitions.entry(key).or_default().push((path, object));
                }
            }
        }
        let mut changed = false;
        for key in keys {
            let defs = definitions.remove(key).unwrap_or_default();
            let winner = defs.last().map(|(_, o)| (*o).clone());
            let current = self.snapshot.get(key);
            let same = match (&winner, &current) {
                (Some(a), Some(b)) => a.same(b),
                (None, None) => true,
                _ => false,
            };
            if !same {
                match winner {
                    Some(object) => {
                        self.snapshot.insert_shared(key.clone(), object);
                    }
                    None => {
                        self.snapshot.remove(key);
                    }
                }
                self.changes.insert(key.clone());
                changed = true;
            }
            if defs.len() > 1 {
                let messages = defs[1..]
                    .iter()
                    .map(|(path, object)| {
                        format!(
                            "{}: {} is defined more than once; the definition in this file wins",
                            path.display(),
                            object.describe()
                        )
                    })
                    .collect();
                self.duplicates.insert(key.clone(), messages);
            } else {
                self.duplicates.remove(key);
            }
        }
        changed
    }

    /// Current parse errors, by file.
    pub fn errors(&self) -> Vec<FileError> {
        self.files.values().filter_map(|s| s.error.clone()).collect()
    }

    /// The snapshot of every file's last good objects. Files are applied in path order; an
    /// object defined twice keeps its last definition.
    pub fn current(&self) -> &Snapshot {
        &self.snapshot
    }

    /// One message per definition of an object that replaced an earlier one.
    pub fn duplicates(&self) -> Vec<String> {
        self.duplicates.values().flatten().cloned().collect()
    }

    /// The keys whose object changed since the last call (all of them after the first scan).
    pub fn take_changes(&mut self) -> Vec<SnapshotKey> {
        std::mem::take(&mut self.changes).into_iter().collect()
    }

    /// A copy of the snapshot (the objects are shared) and the duplicate definitions.
    pub fn snapshot(&self) -> (Snapshot, Vec<String>) {
        (self.snapshot.clone(), self.duplicates())
    }
}

/// Shares the objects of a reparsed file: each object equal to the one of the same key in the
/// previous parse keeps that one's allocation, so its identity says "unchanged" downstream.
fn share_unchanged(old: &[SharedObject], parsed: Vec<Object>) -> Vec<SharedObject> {
    let by_key: HashMap<SnapshotKey, &SharedObject> = old.iter().map(|o| (o.key(), o)).collect();
    parsed
        .into_iter()
        .filter_map(SharedObject::new)
        .map(|object| match by_key.get(&object.key()) {
            Some(previous) if **previous == object => (*previous).clone(),
            _ => object,
        })
        .collect()
}

fn is_manifest(path: &Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"))
}

fn is_hidden(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'))
}

/// Every manifest file below `root`, sorted. Links are followed (ConfigMap mounts are links).
fn list_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    let mut depth_guard = 0usize;
    while let Some(dir) = stack.pop() {
        depth_guard += 1;
        if depth_guard > 10_000 {
            break; // a link loop; what was found so far is used
        }
        let entries =
            std::fs::read_dir(&dir).map_err(|source| Error::ReadDir { path: dir.clone(), source })?;
        for entry in entries.flatten() {
            let path = entry.path();
            if is_hidden(&path) {
                continue;
            }
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => stack.push(path),
                Ok(m) if m.is_file() && is_manifest(&path) => out.push(path),
                _ => {}
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Watches `root` and sends a unit on `tx` whenever something below it may have changed.
///
/// Filesystem notifications (inotify) trigger a full content comparison; a poll every
/// `poll` catches what notifications miss (network filesystems, replaced directories).
/// The returned guard stops the watcher when dropped.
pub fn watch(root: &Path, tx: mpsc::Sender<bool>, poll: Duration) -> Result<WatchGuard> {
    start_watch(root, tx, poll, None)
}

/// What a watcher reported since a scan last took it (see [`watch_paths`]).
#[derive(Debug, Default)]
pub struct Seen {
    /// Manifest files reported created, written, renamed or removed.
    pub paths: BTreeSet<PathBuf>,
    /// Those of `paths` being written in place: modified, and not yet closed.
    pub writing: BTreeSet<PathBuf>,
    /// A notification was lost or failed: every file must be compared.
    pub everything: bool,
}

/// Notifications shared between a watcher and the loop that scans.
pub type SeenCell = Arc<Mutex<Seen>>;

/// Like [`watch`], but notifications also record which manifest files they name (in the
/// returned [`SeenCell`]), so that a scan reads only those and lists the rest
/// ([`ManifestDir::rescan_paths`]). `true` on `tx` is a notification, `false` the poll.
pub fn watch_paths(root: &Path, tx: mpsc::Sender<bool>, poll: Duration) -> Result<(WatchGuard, SeenCell)> {
    let seen = SeenCell::default();
    let guard = start_watch(root, tx, poll, Some(seen.clone()))?;
    Ok((guard, seen))
}

/// After the last notification of a burst of complete writes, how long to wait for another.
const QUIET: Duration = Duration::from_millis(10);

/// Waits for a burst of notifications (on `changes`, from [`watch_paths`]) to end: [`QUIET`]
/// after the last one while every file they name is complete (closed after writing, or renamed
/// into place: an isolated change is read at once), else `longest` after the first (editors
/// write in bursts: truncate, write, rename; a file truncated and still open for writing is
/// not read as the empty manifest it briefly is). Returns how long it waited.
pub async fn settle(seen: &SeenCell, changes: &mut mpsc::Receiver<bool>, longest: Duration) -> Duration {
    let first = tokio::time::Instant::now();
    let latest = first + longest;
    loop {
        let complete = {
            let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
            !seen.everything && seen.writing.is_empty()
        };
        let until = if complete { (tokio::time::Instant::now() + QUIET).min(latest) } else { latest };
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return first.elapsed(),
            more = changes.recv() => if more.is_none() {
                return first.elapsed();
            },
        }
    }
}

fn start_watch(
    root: &Path,
    tx: mpsc::Sender<bool>,
    poll: Duration,
    seen: Option<SeenCell>,
) -> Result<WatchGuard> {
    use notify::Watcher;
    let notify_tx = tx.clone();
    let watched = root.to_path_buf();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Some(seen) = &seen {
            let mut seen = seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match &res {
                Ok(event) => record(&mut seen, &watched, event),
                Err(_) => seen.everything = true,
            }
        }
        match res {
            Ok(event) if event.kind.is_access() && !closed_after_write(&event) => {}
            // `true`: a notification. A full channel already holds a pending scan.
            Ok(_) => {
                let _ = notify_tx.try_send(true);
            }
            Err(error) => {
                tracing::warn!(%error, "file watch error; the poll keeps the manifests fresh");
                let _ = notify_tx.try_send(true);
            }
        }
    })
    .map_err(|source| Error::Watch { path: root.to_path_buf(), source })?;
    watcher
        .watch(root, notify::RecursiveMode::Recursive)
        .map_err(|source| Error::Watch { path: root.to_path_buf(), source })?;
    let poller = tokio::spawn(async move {
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if tx.send(false).await.is_err() {
                return;
            }
        }
    });
    Ok(WatchGuard { _watcher: watcher, poller })
}

fn closed_after_write(event: &notify::Event) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    matches!(event.kind, EventKind::Access(AccessKind::Close(AccessMode::Write)))
}

/// Notes what one notification says about manifest files. Files replaced by a rename or
/// closed after writing are complete; files modified in place are being written until closed.
/// Notifications about other paths (directories, links, temporary files) need no note: a scan
/// lists the directory and compares every file's stamp anyway.
fn record(seen: &mut Seen, root: &Path, event: &notify::Event) {
    use notify::event::{EventKind, ModifyKind};
    if event.need_rescan() {
        seen.everything = true;
    }
    // As listed: a manifest file, with no hidden folder or file on the way from `root`.
    let listed = |path: &&PathBuf| {
        let hidden = |c: std::path::Component<'_>| c.as_os_str().to_str().is_some_and(|s| s.starts_with('.'));
        is_manifest(path)
            && match path.strip_prefix(root) {
                Ok(relative) => !relative.components().any(hidden),
                Err(_) => !is_hidden(path),
            }
    };
    for path in event.paths.iter().filter(listed) {
        match event.kind {
            EventKind::Access(_) if closed_after_write(event) => {
                seen.writing.remove(path);
                seen.paths.insert(path.clone());
            }
            EventKind::Access(_) => {}
            EventKind::Create(_) | EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any) => {
                seen.writing.insert(path.clone());
                seen.paths.insert(path.clone());
            }
            _ => {
                seen.writing.remove(path);
                seen.paths.insert(path.clone());
            }
        }
    }
}

/// Keeps a directory watch alive; dropping it stops the watch.
pub struct WatchGuard {
    _watcher: notify::RecommendedWatcher,
    poller: tokio::task::JoinHandle<()>,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_dataplane::model::ObjectRef;

    const SVC: &str =
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 80\n";

    #[test]
    fn bad_file_keeps_last_good_objects_and_reports_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.yaml");
        std::fs::write(&file, SVC).unwrap();
        let mut src = ManifestDir::new(dir.path());
        assert!(src.rescan(true).unwrap().changed);
        assert_eq!(src.snapshot().0.services.len(), 1);

        std::fs::write(&file, "apiVersion: v1\nkind: Service\nmetadata: [\n").unwrap();
        let scan = src.rescan(true).unwrap();
        assert!(!scan.changed, "a broken file must not change the snapshot");
        assert_eq!(src.snapshot().0.services.len(), 1, "last good objects keep serving");
        let errors = src.errors();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].path, file);
        assert!(errors[0].line.is_some(), "{errors:?}");

        std::fs::remove_file(&file).unwrap();
        assert!(src.rescan(true).unwrap().changed);
        assert!(src.snapshot().0.services.is_empty());
        assert!(src.errors().is_empty());
    }

    #[test]
    fn hidden_and_foreign_files_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        std::fs::write(dir.path().join("..data/svc.yaml"), SVC).unwrap();
        std::fs::write(dir.path().join("README.md"), "not yaml: [").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/svc.yml"), SVC).unwrap();
        let mut src = ManifestDir::new(dir.path());
        src.rescan(true).unwrap();
        assert!(src.errors().is_empty());
        assert_eq!(src.snapshot().0.services.len(), 1);
    }

    #[test]
    fn duplicates_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), SVC).unwrap();
        std::fs::write(dir.path().join("b.yaml"), SVC).unwrap();
        let mut src = ManifestDir::new(dir.path());
        src.rescan(true).unwrap();
        let (snap, dups) = src.snapshot();
        assert_eq!(snap.services.len(), 1);
        assert_eq!(dups.len(), 1, "{dups:?}");
        assert!(dups[0].contains("b.yaml"), "{dups:?}");
    }

    fn service(name: &str, port: u16) -> String {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  ports:\n  - port: {port}\n"
        )
    }

    #[test]
    fn removing_the_winning_definition_restores_the_earlier_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), service("web", 80)).unwrap();
        std::fs::write(dir.path().join("b.yaml"), service("web", 81)).unwrap();
        let mut src = ManifestDir::new(dir.path());
        src.rescan(true).unwrap();
        let port = |src: &ManifestDir| {
            let svc = src.current().services.get(&ObjectRef::new("default", "web")).unwrap();
            svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port
        };
        assert_eq!(port(&src), 81, "the later file wins");
        assert_eq!(src.duplicates().len(), 1);
        std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
        assert!(src.rescan(false).unwrap().changed);
        assert_eq!(port(&src), 80, "the earlier definition serves again");
        assert!(src.duplicates().is_empty());
    }

    #[test]
    fn unchanged_objects_keep_their_identity_and_changes_name_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.yaml");
        std::fs::write(&file, service("a", 80) + &service("b", 80)).unwrap();
        let mut src = ManifestDir::new(dir.path());
        src.rescan(true).unwrap();
        assert_eq!(src.take_changes().len(), 2);
        let before = src.current().clone();
        std::fs::write(&file, service("a", 80) + &service("b", 81)).unwrap();
        src.rescan_paths(&BTreeSet::from([file.clone()])).unwrap();
        let a = ObjectRef::new("default", "a");
        let b = ObjectRef::new("default", "b");
        assert_eq!(src.take_changes(), vec![SnapshotKey::Service(b.clone())]);
        assert!(Arc::ptr_eq(
            before.services.get_shared(&a).unwrap(),
            src.current().services.get_shared(&a).unwrap()
        ));
        assert!(!Arc::ptr_eq(
            before.services.get_shared(&b).unwrap(),
            src.current().services.get_shared(&b).unwrap()
        ));
        assert_eq!(src.current().changes_since(&before), vec![SnapshotKey::Service(b)]);
    }

    /// Random writes and removals across a few files, each followed by a scan of the paths
    /// written (as the watcher reports them): the incrementally kept snapshot and duplicates
    /// always equal those of a fresh read of the directory.
    #[test]
    fn incremental_snapshot_matches_a_fresh_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut src = ManifestDir::new(dir.path());
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut compared = 0;
        for step in 0..300 {
            let file = dir.path().join(format!("{}.yaml", ["a", "b", "c", "d"][next(4) as usize]));
            if next(5) == 0 {
                let _ = std::fs::remove_file(&file);
            } else if next(10) == 0 {
                std::fs::write(&file, "kind: [").unwrap();
            } else {
                let text: String = (0..next(4))
                    .map(|_| service(["s1", "s2", "s3"][next(3) as usize], 80 + next(2) as u16))
                    .collect();
                std::fs::write(&file, text).unwrap();
            }
            src.rescan_paths(&BTreeSet::from([file])).unwrap();
            let mut fresh = ManifestDir::new(dir.path());
            fresh.rescan(true).unwrap();
            // A file that stopped parsing keeps its last good objects in `src` only.
            if src.errors().is_empty() {
                assert_eq!(src.current(), fresh.current(), "step {step}");
                assert_eq!(src.duplicates(), fresh.duplicates(), "step {step}");
                compared += 1;
            }
        }
        assert!(compared > 100, "only {compared} steps without a broken file");
    }

    /// A file written in place is being written until it is closed; one renamed into place is
    /// complete at once; temporary and hidden files are not noted (a scan lists the directory).
    #[test]
    fn notifications_note_manifest_files_and_whether_they_are_complete() {
        use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, ModifyKind, RenameMode};
        use notify::{Event, EventKind};
        let event = |kind, path: &str| Event::new(kind).add_path(PathBuf::from(path));
        let mut seen = Seen::default();
        let record = |seen: &mut Seen, event: &Event| record(seen, Path::new("/m"), event);
        record(&mut seen, &event(EventKind::Create(CreateKind::File), "/m/a.yaml"));
        record(&mut seen, &event(EventKind::Modify(ModifyKind::Data(DataChange::Any)), "/m/a.yaml"));
        assert!(seen.writing.contains(Path::new("/m/a.yaml")), "written in place, not closed yet");
        record(&mut seen, &event(EventKind::Access(AccessKind::Close(AccessMode::Write)), "/m/a.yaml"));
        assert!(seen.writing.is_empty(), "closed after writing: complete");
        record(&mut seen, &event(EventKind::Create(CreateKind::File), "/m/b.yaml.tmp"));
        record(&mut seen, &event(EventKind::Modify(ModifyKind::Name(RenameMode::To)), "/m/b.yaml"));
        record(&mut seen, &event(EventKind::Modify(ModifyKind::Any), "/m/..data/c.yaml"));
        record(&mut seen, &event(EventKind::Remove(notify::event::RemoveKind::File), "/m/d.yml"));
        let paths: Vec<&str> = seen.paths.iter().filter_map(|p| p.to_str()).collect();
        assert_eq!(paths, ["/m/a.yaml", "/m/b.yaml", "/m/d.yml"]);
        assert!(seen.writing.is_empty() && !seen.everything);
        record(&mut seen, &Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan));
        assert!(seen.everything, "lost events: compare every file");
    }
}
