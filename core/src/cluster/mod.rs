//! Finding the workers a cluster manager started, so that a controller
//! connects without being told their addresses: addresses given, then
//! `COLOCATED_WORKERS`, then Slurm (the job's node list, a port derived from
//! the job id), then Kubernetes (a StatefulSet's pods by DNS name, no API
//! access). One rule for every SDK; [`find_workers`] says where it looked
//! when it finds nothing.

use std::net::ToSocketAddrs;
use std::time::Duration;

use crate::error::{Error, Result};

mod kubernetes;
mod slurm;

use kubernetes::from_kubernetes;
use slurm::from_slurm;
pub use slurm::{expand_nodelist, slurm_job_id, slurm_port, worker_port};
/// Comma-separated `HOST:PORT`s of the workers (when no addresses are given).
pub const WORKERS_ENV: &str = "COLOCATED_WORKERS";
/// The port every worker of a Slurm job listens on, when not given:
/// `SLURM_PORT_BASE + SLURM_JOB_ID % 4096` (as JAX picks its coordinator's).
pub const SLURM_PORT_BASE: u16 = 61440;
/// The headless Service of the workers' StatefulSet (Kubernetes).
pub const KUBERNETES_SERVICE_ENV: &str = "COLOCATED_KUBERNETES_SERVICE";
/// How many workers the StatefulSet runs (Kubernetes).
pub const KUBERNETES_REPLICAS_ENV: &str = "COLOCATED_KUBERNETES_REPLICAS";
/// The StatefulSet's name, when it is not the Service's (Kubernetes).
pub const KUBERNETES_STATEFULSET_ENV: &str = "COLOCATED_KUBERNETES_STATEFULSET";
/// The workers' namespace (Kubernetes; default: this pod's, else `default`).
pub const KUBERNETES_NAMESPACE_ENV: &str = "COLOCATED_KUBERNETES_NAMESPACE";
/// The port workers listen on in Kubernetes when not given (the manifests').
pub const KUBERNETES_DEFAULT_PORT: u16 = 61440;
/// The most hosts a node list may name (a bound on what a typo allocates).
const MAX_NODES: usize = 1 << 16;

/// Where to look for workers: [`find_workers`]'s options.
#[derive(Clone, Debug, Default)]
pub struct Discovery {
    /// `"auto"` (or empty): addresses, then each cluster below in order;
    /// `"env"`, `"slurm"` or `"kubernetes"`: that one only.
    pub cluster: String,
    /// The workers' port (default: Slurm's from the job id, Kubernetes'
    /// [`KUBERNETES_DEFAULT_PORT`]).
    pub port: Option<u16>,
    /// Kubernetes: the headless Service (else [`KUBERNETES_SERVICE_ENV`]).
    pub service: Option<String>,
    /// Kubernetes: the replica count (else [`KUBERNETES_REPLICAS_ENV`]).
    pub replicas: Option<usize>,
    /// Kubernetes: the namespace (else [`KUBERNETES_NAMESPACE_ENV`], this
    /// pod's namespace, `default`).
    pub namespace: Option<String>,
    /// How long Kubernetes names may take to appear in DNS (pods that are
    /// not ready yet have none); zero: look once.
    pub timeout: Duration,
}

/// The workers found, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// `HOST:PORT` of each worker, in order (worker `i` becomes process `i + 1`).
    pub addresses: Vec<String>,
    /// Where they came from, for messages (`"SLURM_JOB_NODELIST of job 42"`).
    pub source: String,
}

/// What discovery reads from its surroundings: the environment, files, DNS.
/// [`System`] reads the real ones; tests give their own.
pub trait Surroundings {
    /// An environment variable (`None` when unset or not UTF-8).
    fn env(&self, name: &str) -> Option<String>;
    /// A file's text (`None` when it cannot be read).
    fn read(&self, path: &str) -> Option<String>;
    /// The IP addresses `host` resolves to (empty when it does not, yet).
    fn resolve(&self, host: &str) -> Vec<std::net::IpAddr>;
}

/// The process's environment, files and resolver.
pub struct System;

impl Surroundings for System {
    fn env(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }

    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    fn resolve(&self, host: &str) -> Vec<std::net::IpAddr> {
        (host, 0)
            .to_socket_addrs()
            .map(|addrs| addrs.map(|a| a.ip()).collect())
            .unwrap_or_default()
    }
}

/// The workers to connect to: `addresses` when given (non-empty); else by
/// `options.cluster` (see [`Discovery::cluster`]). `invalid_argument` for a
/// malformed source (naming it), `not_found` when none has workers (listing
/// where it looked), `unavailable` when Kubernetes names did not appear
/// within the timeout (naming them).
pub fn find_workers(
    addresses: &[String],
    options: &Discovery,
    around: &dyn Surroundings,
) -> Result<Found> {
    if !addresses.is_empty() {
        return Ok(Found {
            addresses: addresses.to_vec(),
            source: "the addresses given".into(),
        });
    }
    let cluster = match options.cluster.as_str() {
        "" => "auto",
        other => other,
    };
    let sources: &[&str] = match cluster {
        "auto" => &["env", "slurm", "kubernetes"],
        "env" => &["env"],
        "slurm" => &["slurm"],
        "kubernetes" => &["kubernetes"],
        other => {
            return Err(Error::invalid_argument(format!(
                "unknown cluster {other:?}: auto, env, slurm or kubernetes"
            )))
        }
    };
    let mut looked = Vec::new();
    for source in sources {
        let found = match *source {
            "env" => from_env(around)?,
            "slurm" => from_slurm(options, around)?,
            _ => from_kubernetes(options, around)?,
        };
        match found {
            Ok(found) => return Ok(found),
            Err(absent) => looked.push(absent),
        }
    }
    Err(Error::not_found(format!(
        "no workers to connect to: no addresses were given, and {}",
        looked.join("; ")
    )))
}

/// Workers of `COLOCATED_WORKERS`, or why there are none.
fn from_env(around: &dyn Surroundings) -> Result<std::result::Result<Found, String>> {
    let Some(text) = around.env(WORKERS_ENV).filter(|t| !t.trim().is_empty()) else {
        return Ok(Err(format!("{WORKERS_ENV} is not set")));
    };
    let addresses: Vec<String> = text
        .split([',', ' ', '\n'])
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect();
    if let Some(bad) = addresses.iter().find(|a| !has_port(a)) {
        return Err(Error::invalid_argument(format!(
            "{WORKERS_ENV}: {bad:?} is not HOST:PORT"
        )));
    }
    Ok(Ok(Found {
        addresses,
        source: WORKERS_ENV.into(),
    }))
}

/// Whether `address` ends in `:PORT`.
fn has_port(address: &str) -> bool {
    address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

/// `HOST:PORT`, bracketing an IPv6 host.
fn join(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests;
