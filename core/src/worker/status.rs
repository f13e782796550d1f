//! The command line of `colocated status`: its table of flags, which every
//! CLI (Rust, Python, Node) builds its parser from, and what it does.

use std::path::PathBuf;

use super::flags::{flag, seconds, FlagKind, WorkerFlag};
use crate::error::{Error, Result};
use crate::transport::Token;

/// The flags of `colocated status [ADDRESS...]` (after its addresses), in
/// help order: how to reach the workers, and where to find them when no
/// address is given.
pub const STATUS_FLAGS: &[WorkerFlag] = &[
    flag(
        "token-file",
        FlagKind::Path,
        "File holding the workers' token (default: the COLOCATED_TOKEN environment variable).",
    ),
    flag(
        "tls-ca",
        FlagKind::Path,
        "Connect with TLS, trusting the CA certificates in this PEM file.",
    ),
    flag(
        "tls-domain",
        FlagKind::Name,
        "The name the workers' certificates carry (default: each address's host).",
    ),
    WorkerFlag {
        default: Some("5"),
        ..flag(
            "timeout",
            FlagKind::Seconds,
            "Seconds to wait for each worker's answer.",
        )
    },
    WorkerFlag {
        default: Some("auto"),
        ..flag(
            "cluster",
            FlagKind::Name,
            "Without addresses, where to find the workers: auto (COLOCATED_WORKERS, then the \
             Slurm job, then Kubernetes), env, slurm or kubernetes.",
        )
    },
    flag(
        "port",
        FlagKind::Port,
        "Without addresses, the workers' port (default: the Slurm job's, or 61440 in Kubernetes).",
    ),
];

/// The values of `colocated status`'s command line.
#[derive(Clone, Debug, Default)]
pub struct StatusFlags {
    /// The workers' addresses (none: find them, see `--cluster`).
    pub addresses: Vec<String>,
    /// `--token-file`.
    pub token_file: Option<PathBuf>,
    /// `--tls-ca`.
    pub tls_ca: Option<PathBuf>,
    /// `--tls-domain`.
    pub tls_domain: Option<String>,
    /// `--timeout`.
    pub timeout: f64,
    /// `--cluster`.
    pub cluster: String,
    /// `--port`.
    pub port: Option<String>,
}

impl StatusFlags {
    /// Asks every worker (those given, else those found) how it is: one line
    /// per worker, and whether all answered. `invalid_argument` naming a bad
    /// flag; `not_found` when no worker is given or found.
    pub fn run(&self) -> Result<(String, bool)> {
        use crate::cluster::{find_workers, worker_port, Discovery, System};
        use crate::session::{status_report, ConnectOptions};
        let timeout = seconds("--timeout", self.timeout)?;
        let port = match &self.port {
            Some(text) => Some(worker_port(text, &System)?),
            None => None,
        };
        let found = find_workers(
            &self.addresses,
            &Discovery {
                cluster: self.cluster.clone(),
                port,
                timeout,
                ..Discovery::default()
            },
            &System,
        )?;
        let mut connect = ConnectOptions::new(
            String::new(),
            Token::resolve(None, self.token_file.as_deref())?,
        );
        connect.timeout = timeout;
        connect.client_name = "colocated status".into();
        if let Some(path) = &self.tls_ca {
            connect.tls_ca = Some(std::fs::read(path).map_err(|e| {
                Error::invalid_argument(format!("cannot read --tls-ca {}: {e}", path.display()))
            })?);
        }
        connect.tls_domain = self.tls_domain.clone();
        Ok(status_report(&found.addresses, &connect))
    }
}
