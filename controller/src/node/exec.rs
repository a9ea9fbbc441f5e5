//! Running the kernel tools (`iptables-restore`, `nft`, `conntrack`, ...), optionally inside a
//! network namespace through a command prefix such as `ip netns exec NAME`.

use std::io::Write as _;
use std::process::{Command, Stdio};

/// Errors of running a tool.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The program could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The program ran and failed.
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        /// The program and its arguments.
        program: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
}

/// A `Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a successful run printed.
#[derive(Clone, Debug, Default)]
pub struct Output {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs programs, each prefixed with a fixed command (empty: run directly).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Runner {
    prefix: Vec<String>,
}

impl Runner {
    /// Runs programs directly, in the current network namespace.
    pub fn host() -> Self {
        Runner::default()
    }

    /// Runs programs inside the named network namespace (`ip netns exec NAME ...`).
    pub fn netns(name: &str) -> Self {
        Runner { prefix: vec!["ip".into(), "netns".into(), "exec".into(), name.into()] }
    }

    /// Whether programs run directly (in this process's network namespace).
    pub fn is_host(&self) -> bool {
        self.prefix.is_empty()
    }

    /// The network namespace programs run in, when made with [`Runner::netns`].
    pub fn netns_name(&self) -> Option<&str> {
        match self.prefix.as_slice() {
            [ip, netns, exec, name] if ip == "ip" && netns == "netns" && exec == "exec" => Some(name),
            _ => None,
        }
    }

    /// Runs programs behind an arbitrary prefix command.
    pub fn with_prefix(prefix: Vec<String>) -> Self {
        Runner { prefix }
    }

    /// The command for `program args...`, with the prefix applied.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args);
        cmd
    }

    /// Runs `program args...`, feeding `stdin` if given; a non-zero exit is an error.
    pub fn run(&self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<Output> {
        let (status, out) = self.status(program, args, stdin)?;
        if status.success() {
            Ok(out)
        } else {
            Err(Error::Failed {
                program: format!("{program} {}", args.join(" ")),
                status,
                stderr: out.stderr.trim().to_string(),
            })
        }
    }

    /// Runs `program args...` and returns its exit status and output, whatever the status.
    pub fn status(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<(std::process::ExitStatus, Output)> {
        let spawn_err = |source| Error::Spawn { program: program.to_string(), source };
        let mut cmd = self.command(program, args);
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(spawn_err)?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A tool that exits early closes the pipe; its exit status tells the story.
            if let Err(e) = pipe.write_all(text.as_bytes())
                && e.kind() != std::io::ErrorKind::BrokenPipe
            {
                return Err(spawn_err(e));
            }
        }
        let output = child.wait_with_output().map_err(spawn_err)?;
        Ok((
            output.status,
            Output {
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            },
        ))
    }
}
