//! Ingress conformance runner.
//!
//! A scenario (`scenarios/<name>.yaml`, format in `conformance/README.md`) names echo backends
//! and a list of steps. The runner starts the echo replicas on loopback addresses, starts weir
//! in-process on a temporary manifests directory, and for each step writes or deletes manifest
//! files, waits for weir to publish the new routing table, then sends real HTTP/1.1 requests and
//! checks who answered. Every failed check is collected in a [`Report`] rather than stopping at
//! the first.

pub mod backends;
pub mod check;
pub mod kube;
pub mod scenario;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use weir::serve::{KubeServe, Running, ServeOptions};
use weir::source::kube::KubeOptions;
use weir::status::StatusOptions;

use crate::backends::Backends;
use crate::check::Checker;
use crate::kube::{ApiSink, KubeTarget};
use crate::scenario::{Reload, Scenario, ScenarioError, Step};

/// How long weir may take to publish after a step changes files (it promises 1 s).
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// After a publish, further publishes within this time are waited for too (a burst of file
/// events may be published in several tables).
const QUIET_PERIOD: Duration = Duration::from_millis(300);
/// The same through an API server: objects applied one by one reach weir through one watch per
/// kind, in no order across kinds, and weir publishes a burst at the latest 1 s after its first
/// change (`--sync-max-delay-ms`); a long step is published in parts, the last part well after
/// the first (it failed 1 run in 3 with 300 ms on a loaded machine).
const QUIET_PERIOD_KUBE: Duration = Duration::from_millis(1500);
/// How long a [`Reload::Settle`] step waits.
const SETTLE_TIME: Duration = Duration::from_millis(1500);

/// Errors that stop a scenario before its checks can run (not failed checks: see [`Report`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The scenario file is unreadable or invalid.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// The echo replicas could not start.
    #[error("cannot start the echo backends: {0}")]
    Backends(#[source] std::io::Error),
    /// The manifests directory could not be prepared or changed.
    #[error("{what}: {source}")]
    Files {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A placeholder in a manifest cannot be substituted.
    #[error("step {step}, file {file}: {reason}")]
    Placeholder {
        /// The step.
        step: String,
        /// The file.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A tool the scenario needs is not installed (tests may skip, unless `WEIR_REQUIRE_ALL`).
    #[error("{0}")]
    Unavailable(String),
    /// weir did not start.
    #[error("cannot start weir: {0:#}")]
    Start(#[source] anyhow::Error),
}

/// A `Result` of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One failed check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The step, as `2 (edit the ingress)`.
    pub step: String,
    /// What was checked: the request, or `reload`.
    pub check: String,
    /// Expected versus got.
    pub problem: String,
}

/// The outcome of a scenario run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The scenario's name (its file stem).
    pub scenario: String,
    /// How many checks ran (reloads and requests).
    pub checks: usize,
    /// The checks that failed, in order.
    pub failures: Vec<Failure>,
    /// Checks marked `known_failure` that failed as expected (they do not fail the scenario but
    /// are always printed, with why).
    pub known: Vec<Failure>,
    /// What did not run, and why (steps marked `manifests_only` through an API server; status
    /// conditions without one).
    pub skipped: Vec<String>,
}

impl Report {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.passed() {
            write!(f, "scenario {}: all {} checks passed", self.scenario, self.checks - self.known.len())?;
        } else {
            write!(
                f,
                "scenario {}: {} of {} checks failed",
                self.scenario,
                self.failures.len(),
                self.checks
            )?;
        }
        for failure in &self.failures {
            write!(f, "\n  step {}: {}: {}", failure.step, failure.check, failure.problem)?;
        }
        if !self.known.is_empty() {
            write!(f, "\n  {} known failures (docs/gateway-api.md lists them):", self.known.len())?;
        }
        for known in &self.known {
            write!(f, "\n  KNOWN step {}: {}: {}", known.step, known.check, known.problem)?;
        }
        for skipped in &self.skipped {
            write!(f, "\n  not run: {skipped}")?;
        }
        Ok(())
    }
}

/// The directory of the scenarios shipped with this crate.
pub fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

/// Loads and runs the scenario file at `path`.
pub async fn run_file(path: &Path) -> Result<Report> {
    let scenario = Scenario::load(path)?;
    let name =
        path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned());
    run(&name, &scenario).await
}

/// Runs a scenario against a fresh in-process weir and fresh echo backends.
pub async fn run(name: &str, scenario: &Scenario) -> Result<Report> {
    run_with(name, scenario, None).await
}

/// Loads and runs the scenario file at `path` through a Kubernetes API server: the objects are
/// applied through the API and weir reads them with its Kubernetes source.
pub async fn run_file_kube(path: &Path, target: &KubeTarget) -> Result<Report> {
    let scenario = Scenario::load(path)?;
    let name =
        path.file_stem().map_or_else(|| path.display().to_string(), |s| s.to_string_lossy().into_owned());
    run_with(&name, &scenario, Some(target)).await
}

async fn run_with(name: &str, scenario: &Scenario, target: Option<&KubeTarget>) -> Result<Report> {
    let mut backends = Backends::start(&scenario.replicas()).await.map_err(Error::Backends)?;
    if scenario.memcached
        && let Err(error) = backends.start_memcached().await
    {
        backends.stop().await;
        return Err(if error.kind() == std::io::ErrorKind::NotFound {
            Error::Unavailable(error.to_string())
        } else {
            Error::Backends(error)
        });
    }
    if let Some(target) = target
        && scenario.uses_gateway_api()
        && let Err(error) = kube::install_gateway_crds(&target.client).await
    {
        backends.stop().await;
        return Err(Error::Start(anyhow::anyhow!("installing the Gateway API CRDs: {error}")));
    }
    let dirs = Dirs::new()?;
    let mut options = ServeOptions { manifests: dirs.manifests.clone(), ..ServeOptions::default() };
    let mut api = None;
    if let Some(target) = target {
        options.kube = Some(KubeServe {
            // The settings ConfigMap standalone mode reads by default, watched likewise.
            source: KubeOptions {
                kubeconfig: Some(target.kubeconfig.clone()),
                configmap: options.settings.clone(),
                ..KubeOptions::default()
            },
            status: StatusOptions {
                publish_status_addresses: vec!["192.0.2.1".to_owned()],
                ..StatusOptions::default()
            },
        });
        api = Some((ApiSink::new(target.clone()), BTreeMap::new()));
    }
    let running = match Running::start(options).await {
        Ok(running) => running,
        Err(error) => {
            backends.stop().await;
            return Err(Error::Start(error));
        }
    };
    let mut run = Run {
        scenario,
        dirs: &dirs,
        api,
        backends: &backends,
        running: &running,
        checker: Checker::new(running.http_addr),
        report: Report {
            scenario: name.to_owned(),
            checks: 0,
            failures: Vec::new(),
            known: Vec::new(),
            skipped: Vec::new(),
        },
    };
    let mut result = Ok(());
    for (index, step) in scenario.steps.iter().enumerate() {
        result = run.step(step, &scenario.step_label(index)).await;
        if result.is_err() {
            break;
        }
    }
    let report = run.report;
    running.shutdown().await;
    backends.stop().await;
    result.map(|()| report)
}

/// One scenario run in progress.
struct Run<'a> {
    scenario: &'a Scenario,
    dirs: &'a Dirs,
    /// When running through an API server: its sink and the current file texts.
    api: Option<(ApiSink, BTreeMap<String, String>)>,
    backends: &'a Backends,
    running: &'a Running,
    checker: Checker,
    report: Report,
}

impl Run<'_> {
    /// Applies a step's file changes, waits as it says, and checks its expectations.
    async fn step(&mut self, step: &Step, label: &str) -> Result<()> {
        if let (Some(why), Some(_)) = (&step.manifests_only, &self.api) {
            self.report.skipped.push(format!("step {label} (manifests only: {why})"));
            return Ok(());
        }
        if step.pause_ms > 0 {
            tokio::time::sleep(Duration::from_millis(step.pause_ms)).await;
        }
        let before = self.running.table_version();
        let changed = !step.files.is_empty() || !step.delete.is_empty();
        for (file, text) in &step.files {
            let text = scenario::substitute(text, self.backends).map_err(|reason| Error::Placeholder {
                step: label.to_owned(),
                file: file.clone(),
                reason,
            })?;
            match &mut self.api {
                Some((_, files)) => drop(files.insert(file.clone(), text)),
                None => self.dirs.write(file, &text)?,
            }
        }
        for file in &step.delete {
            match &mut self.api {
                Some((_, files)) => drop(files.remove(file)),
                None => self.dirs.delete(file)?,
            }
        }
        if changed
            && let Some((sink, files)) = &mut self.api
            && let Err(problem) = sink.sync(files).await
        {
            self.report.checks += 1;
            self.fail(label, "apply through the API".to_owned(), problem);
        }

        if changed {
            match step.reload {
                Reload::Publish => {
                    self.report.checks += 1;
                    let quiet = if self.api.is_some() { QUIET_PERIOD_KUBE } else { QUIET_PERIOD };
                    if let Err(problem) = wait_for_publish(self.running, before, quiet).await {
                        self.fail(label, "reload".to_owned(), problem);
                    }
                }
                Reload::Settle => tokio::time::sleep(SETTLE_TIME).await,
            }
        }

        for expect in &step.expect {
            self.report.checks += 1;
            let result = self.checker.check(self.scenario, expect).await;
            self.outcome(label, expect.describe(), expect.known_failure.as_deref(), result);
        }

        if step.conditions.is_empty() {
            return Ok(());
        }
        let Some((sink, _)) = &self.api else {
            self.report.skipped.push(format!(
                "step {label}: {} status conditions (weir writes status through an API server only)",
                step.conditions.len()
            ));
            return Ok(());
        };
        for (condition, result) in step.conditions.iter().zip(sink.check_conditions(&step.conditions).await) {
            self.report.checks += 1;
            self.outcome(label, condition.describe(), condition.known_failure.as_deref(), result);
        }
        Ok(())
    }

    /// Records a check's result, `known` saying why it is expected to fail.
    fn outcome(&mut self, step: &str, check: String, known: Option<&str>, result: Result<(), String>) {
        match (known, result) {
            (None, Ok(())) => {}
            (None, Err(problem)) => self.fail(step, check, problem),
            (Some(why), Err(problem)) => self.report.known.push(Failure {
                step: step.to_owned(),
                check,
                problem: format!("{problem} (known: {why})"),
            }),
            (Some(why), Ok(())) => self.fail(
                step,
                check,
                format!("passed, but is marked as a known failure ({why}): remove the mark and its line in docs/gateway-api.md"),
            ),
        }
    }

    fn fail(&mut self, step: &str, check: String, problem: String) {
        self.report.failures.push(Failure { step: step.to_owned(), check, problem });
    }
}

/// Waits for a table newer than `before`, then for publishes to stop for `quiet`.
async fn wait_for_publish(running: &Running, before: u64, quiet: Duration) -> Result<(), String> {
    let mut version = running
        .wait_for_version(before, PUBLISH_TIMEOUT)
        .await
        .map_err(|error| {
            format!(
                "expected a new routing table within {PUBLISH_TIMEOUT:?} (version was {before}), got none: {error:#}"
            )
        })?;
    // Bounded: a weir that publishes forever shows up as failed checks, not a hang.
    for _ in 0..20 {
        match running.wait_for_version(version, quiet).await {
            Ok(newer) => version = newer,
            Err(_) => break,
        }
    }
    Ok(())
}

// === Dirs ===

/// The manifests directory weir watches, and a staging directory on the same file system so
/// each file appears whole, by rename.
struct Dirs {
    _root: tempfile::TempDir,
    manifests: PathBuf,
    staging: PathBuf,
}

impl Dirs {
    fn new() -> Result<Dirs> {
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| Error::Files { what, source }
        };
        let root = tempfile::tempdir().map_err(io("cannot create a temporary directory"))?;
        let manifests = root.path().join("manifests");
        let staging = root.path().join("staging");
        std::fs::create_dir(&manifests).map_err(io("cannot create the manifests directory"))?;
        std::fs::create_dir(&staging).map_err(io("cannot create the staging directory"))?;
        Ok(Dirs { _root: root, manifests, staging })
    }

    fn write(&self, file: &str, text: &str) -> Result<()> {
        let staged = self.staging.join(file);
        let target = self.manifests.join(file);
        std::fs::write(&staged, text)
            .and_then(|()| std::fs::rename(&staged, &target))
            .map_err(|source| Error::Files { what: format!("cannot write {}", target.display()), source })
    }

    fn delete(&self, file: &str) -> Result<()> {
        let target = self.manifests.join(file);
        std::fs::remove_file(&target)
            .map_err(|source| Error::Files { what: format!("cannot delete {}", target.display()), source })
    }
}
