//! What a worker says about itself: its `Health` (version, devices,
//! sessions, uptime), asked with the token but no session, for
//! `colocated status` and readiness probes.

use std::time::Duration;

use tonic::Request;

use super::block_on;
use super::connect::{authorization, endpoint, ConnectOptions};
use crate::error::{Error, Result};
use crate::transport::from_status;
use crate::transport::proto::worker_client::WorkerClient;
use crate::transport::proto::HealthRequest;
use crate::transport::AUTHORIZATION;

/// What a worker says about itself ([`health`]): `colocated status`'s line.
#[derive(Clone, Debug)]
pub struct WorkerHealth {
    /// The address asked.
    pub address: String,
    /// Its colocated version.
    pub version: String,
    /// The protocol versions it speaks, inclusive.
    pub protocol: (u32, u32),
    /// Its devices' kinds, one per device.
    pub devices: Vec<String>,
    /// The program languages it runs.
    pub languages: Vec<String>,
    /// Sessions open now.
    pub sessions: u32,
    /// Since it started.
    pub uptime: Duration,
}

impl std::fmt::Display for WorkerHealth {
    /// `ADDRESS  colocated V (protocol A-B)  N KIND devices  languages L  S sessions  up T`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kinds: Vec<(String, usize)> = Vec::new();
        for kind in &self.devices {
            match kinds.iter_mut().find(|(k, _)| k == kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((kind.clone(), 1)),
            }
        }
        let devices = match kinds.is_empty() {
            true => "no devices".to_string(),
            false => kinds
                .iter()
                .map(|(kind, n)| format!("{n} {kind} device{}", if *n == 1 { "" } else { "s" }))
                .collect::<Vec<_>>()
                .join(", "),
        };
        let seconds = self.uptime.as_secs();
        let uptime = match seconds {
            s if s < 60 => format!("{s}s"),
            s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
            s if s < 86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
            s => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
        };
        write!(
            f,
            "{}  colocated {} (protocol {}-{})  {devices}  languages {}  {} session{}  up {uptime}",
            self.address,
            self.version,
            self.protocol.0,
            self.protocol.1,
            self.languages.join(","),
            self.sessions,
            if self.sessions == 1 { "" } else { "s" },
        )
    }
}

/// Asks the worker at `options.address` how it is (its `Health`), within
/// `options.timeout`: the token is needed, a session is not. A worker that
/// cannot be reached is `unavailable`; a refused token is
/// `unauthenticated`.
pub fn health(options: &ConnectOptions) -> Result<WorkerHealth> {
    let endpoint = endpoint(options, &options.address)?;
    let authorization = authorization(&options.token)?;
    let (address, timeout) = (options.address.clone(), options.timeout);
    let response = block_on(async move {
        let channel = tokio::time::timeout(timeout, endpoint.connect())
            .await
            .map_err(|_| Error::unavailable(format!("connecting to {address} timed out")))?
            .map_err(|e| Error::unavailable(format!("cannot connect to {address}: {e}")))?;
        let mut request = Request::new(HealthRequest {});
        if let Some(value) = authorization {
            request.metadata_mut().insert(AUTHORIZATION, value);
        }
        let answer = WorkerClient::new(channel).health(request).await;
        answer
            .map(tonic::Response::into_inner)
            .map_err(|s| from_status(&s).context(format!("worker {address}")))
    })??;
    let host = response.host.unwrap_or_default();
    Ok(WorkerHealth {
        address: options.address.clone(),
        version: response.software_version,
        protocol: (response.protocol_min, response.protocol_max),
        // A plugin's devices go by their backend and kind: `cuda (NVIDIA H100
        // 80GB HBM3)`; the host's CPU devices by their kind.
        devices: host
            .devices
            .into_iter()
            .map(|d| match d.backend.as_str() {
                "" | "cpu" => d.kind,
                backend => format!("{backend} ({})", d.kind),
            })
            .collect(),
        languages: host.languages,
        sessions: response.sessions,
        uptime: Duration::from_millis(response.uptime_ms),
    })
}

/// `colocated status`: asks every worker of `addresses` at once (each
/// reached as `connect` says) and gives one line per worker, in order (its
/// [`WorkerHealth`], or `ADDRESS  unavailable: why`), and whether all
/// answered.
pub fn status_report(addresses: &[String], connect: &ConnectOptions) -> (String, bool) {
    let answers: Vec<Result<WorkerHealth>> = std::thread::scope(|scope| {
        let asked: Vec<_> = addresses
            .iter()
            .map(|address| {
                let options = ConnectOptions {
                    address: address.clone(),
                    ..connect.clone()
                };
                scope.spawn(move || health(&options))
            })
            .collect();
        asked
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::internal("asking a worker panicked")))
            })
            .collect()
    });
    let mut report = String::new();
    let mut all = true;
    for (address, answer) in addresses.iter().zip(answers) {
        match answer {
            Ok(health) => report.push_str(&health.to_string()),
            Err(err) => {
                all = false;
                report.push_str(&format!("{address}  {}: {}", err.code(), err.message()));
            }
        }
        report.push('\n');
    }
    (report, all)
}
