//! The manifest-directory source: reads, watches and reloads `--manifests DIR`.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file below DIR (hidden files and folders, such as the
//! `..data` links of a mounted ConfigMap, are skipped) is parsed into Kubernetes objects. Each
//! file's last good parse is kept: a file that stops parsing is reported (file, line, reason) and
//! its previous objects keep serving, so one typo never drops routes.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use super::manifest::{self, ManifestError, Object};
use crate::translate::Snapshot;

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
    /// Modification time and length when last read: a cheap change check for polling.
    stamp: (Option<SystemTime>, u64),
    /// Content of the last read, successful or not, to skip reparsing unchanged files.
    content: Vec<u8>,
    /// Objects of the last good parse (empty if the file never parsed).
    objects: Vec<Object>,
    /// The current error, if the newest content does not parse.
    error: Option<FileError>,
}

/// The state of a manifest directory: every file's last good objects and current errors.
#[derive(Debug)]
pub struct ManifestDir {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
}

/// The outcome of a (re)scan.
#[derive(Debug, Default)]
pub struct Scan {
    /// Whether any file's objects changed (a new snapshot should be translated).
    pub changed: bool,
}

impl ManifestDir {
    /// A source for `root`; nothing is read until [`ManifestDir::rescan`].
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ManifestDir { root: root.into(), files: BTreeMap::new() }
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Re-reads the directory. With `force`, every file's content is compared; without it, only
    /// files whose modification time or length changed (a cheap poll).
    pub fn rescan(&mut self, force: bool) -> Result<Scan> {
        let paths = list_files(&self.root)?;
        let mut scan = Scan::default();
        let before = self.files.len();
        self.files.retain(|p, _| paths.contains(p));
        if self.files.len() != before {
            scan.changed = true;
        }
        for path in paths {
            let meta = std::fs::metadata(&path);
            let stamp = match &meta {
                Ok(m) => (m.modified().ok(), m.len()),
                Err(_) => (None, 0),
            };
            if let Some(state) = self.files.get(&path)
                && !force
                && state.stamp == stamp
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
                        content: Vec::new(),
                        objects: Vec::new(),
                        error: None,
                    });
                    if state.error.as_ref() != Some(&error) {
                        tracing::warn!(%error, "manifest file unreadable; keeping its last good objects");
                    }
                    state.error = Some(error);
                    continue;
                }
            };
            if let Some(state) = self.files.get_mut(&path)
                && state.content == content
            {
                state.stamp = stamp;
                continue;
            }
            let parsed = std::str::from_utf8(&content)
                .map_err(|e| FileError { path: path.clone(), line: None, reason: format!("not UTF-8: {e}") })
                .and_then(|text| {
                    manifest::parse_manifests(text).map_err(|e| FileError::from_manifest(&path, &e))
                });
            let state = self.files.entry(path.clone()).or_insert_with(|| FileState {
                stamp,
                content: Vec::new(),
                objects: Vec::new(),
                error: None,
            });
            state.stamp = stamp;
            state.content = content;
            match parsed {
                Ok(objects) => {
                    if state.error.take().is_some() {
                        tracing::info!(path = %path.display(), "manifest file parses again");
                    }
                    state.objects = objects;
                    scan.changed = true;
                }
                Err(error) => {
                    tracing::warn!(%error, "manifest file does not parse; keeping its last good objects");
                    state.error = Some(error);
                }
            }
        }
        Ok(scan)
    }

    /// Current parse errors, by file.
    pub fn errors(&self) -> Vec<FileError> {
        self.files.values().filter_map(|s| s.error.clone()).collect()
    }

    /// Builds a snapshot from every file's last good objects. Files are applied in path order;
    /// an object defined twice keeps its last definition and the duplicate is reported.
    pub fn snapshot(&self) -> (Snapshot, Vec<String>) {
        let mut snapshot = Snapshot::default();
        let mut duplicates = Vec::new();
        for (path, state) in &self.files {
            for object in &state.objects {
                if let Some(old) = snapshot.insert(object.clone()) {
                    duplicates.push(format!(
                        "{}: {} is defined more than once; the definition in this file wins",
                        path.display(),
                        old.describe()
                    ));
                }
            }
        }
        (snapshot, duplicates)
    }
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
    use notify::Watcher;
    let notify_tx = tx.clone();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        match res {
            Ok(event) if event.kind.is_access() => {}
            // `true`: compare every file's content. A full channel already holds a pending scan.
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
}
