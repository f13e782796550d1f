//! Finding the workers a cluster manager started, so that a controller
//! connects without being told their addresses: addresses given, then
//! `COLOCATED_WORKERS`, then Slurm (the job's node list, a port derived from
//! the job id), then Kubernetes (a StatefulSet's pods by DNS name, no API
//! access). One rule for every SDK; [`find_workers`] says where it looked
//! when it finds nothing.

use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

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

/// The port the workers of Slurm job `job_id` listen on by default.
pub fn slurm_port(job_id: u64) -> u16 {
    SLURM_PORT_BASE + (job_id % 4096) as u16
}

/// The Slurm job's id from its environment (`SLURM_JOB_ID`, else
/// `SLURM_JOBID`): `None` outside a job, `invalid_argument` if malformed.
pub fn slurm_job_id(around: &dyn Surroundings) -> Result<Option<u64>> {
    let Some((name, text)) = ["SLURM_JOB_ID", "SLURM_JOBID"]
        .iter()
        .find_map(|name| around.env(name).map(|text| (*name, text)))
    else {
        return Ok(None);
    };
    text.trim()
        .parse()
        .map(Some)
        .map_err(|_| Error::invalid_argument(format!("{name} {text:?} is not a job id")))
}

/// A worker's `--port`: a number, or `auto` for the Slurm job's
/// ([`slurm_port`]). `invalid_argument` otherwise, or for `auto` outside a job.
pub fn worker_port(text: &str, around: &dyn Surroundings) -> Result<u16> {
    if text == "auto" {
        return match slurm_job_id(around)? {
            Some(job) => Ok(slurm_port(job)),
            None => Err(Error::invalid_argument(
                "--port auto takes the port from the Slurm job (SLURM_JOB_ID), and this is \
                 not in one: give a number",
            )),
        };
    }
    text.parse().map_err(|_| {
        Error::invalid_argument(format!("--port {text:?} is neither a port number nor auto"))
    })
}

/// Workers of the Slurm job, one per node, or why there are none.
fn from_slurm(
    options: &Discovery,
    around: &dyn Surroundings,
) -> Result<std::result::Result<Found, String>> {
    let Some((name, list)) = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        .iter()
        .find_map(|name| around.env(name).map(|list| (*name, list)))
    else {
        return Ok(Err(
            "this is not a Slurm job (SLURM_JOB_NODELIST is not set)".into(),
        ));
    };
    let nodes = expand_nodelist(&list).map_err(|e| e.context(name))?;
    let job = slurm_job_id(around)?;
    let port = match (options.port, job) {
        (Some(port), _) => port,
        (None, Some(job)) => slurm_port(job),
        (None, None) => {
            return Err(Error::invalid_argument(format!(
                "{name} is set but SLURM_JOB_ID is not: give the workers' port"
            )))
        }
    };
    let source = match job {
        Some(job) => format!("{name} of Slurm job {job} (port {port})"),
        None => format!("{name} (port {port})"),
    };
    Ok(Ok(Found {
        addresses: nodes.iter().map(|n| join(n, port)).collect(),
        source,
    }))
}

/// `HOST:PORT`, bracketing an IPv6 host.
fn join(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The host names of a Slurm node list, in order: comma-separated entries,
/// each a name with bracketed ranges (`a[001-003,7],b1` is `a001 a002 a003
/// a7 b1`; several brackets in one entry combine, `r[1-2]n[1-2]` is `r1n1
/// r1n2 r2n1 r2n2`; a range keeps its lower bound's zero padding).
/// `invalid_argument` for malformed text.
pub fn expand_nodelist(list: &str) -> Result<Vec<String>> {
    let bad = |why: &str| Error::invalid_argument(format!("bad node list {list:?}: {why}"));
    let mut hosts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let mut entries = Vec::new();
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1).ok_or_else(|| bad("an unmatched ]"))?,
            ',' if depth == 0 => {
                entries.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(bad("an unmatched ["));
    }
    entries.push(&list[start..]);
    for entry in entries {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(bad("an empty entry"));
        }
        // The entry's pieces: text, and the choices of each bracket.
        let mut names = vec![String::new()];
        let mut rest = entry;
        while let Some(open) = rest.find('[') {
            let close = rest[open..]
                .find(']')
                .map(|c| open + c)
                .ok_or_else(|| bad("an unmatched ["))?;
            let prefix = &rest[..open];
            let choices = expand_ranges(&rest[open + 1..close]).map_err(|why| bad(&why))?;
            let mut next = Vec::with_capacity(names.len() * choices.len());
            for name in &names {
                for choice in &choices {
                    next.push(format!("{name}{prefix}{choice}"));
                }
            }
            if hosts.len() + next.len() > MAX_NODES {
                return Err(bad(&format!("more than {MAX_NODES} nodes")));
            }
            names = next;
            rest = &rest[close + 1..];
        }
        if rest.contains(']') {
            return Err(bad("an unmatched ]"));
        }
        hosts.extend(names.into_iter().map(|name| format!("{name}{rest}")));
        if hosts.len() > MAX_NODES {
            return Err(bad(&format!("more than {MAX_NODES} nodes")));
        }
    }
    Ok(hosts)
}

/// The numbers of a bracket's `1-3,7,010-012` as text (padded as written).
fn expand_ranges(ranges: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    for range in ranges.split(',') {
        let range = range.trim();
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        match range.split_once('-') {
            None if digits(range) => out.push(range.to_string()),
            Some((low, high)) if digits(low) && digits(high) => {
                let width = low.len();
                let (a, b): (u64, u64) = match (low.parse(), high.parse()) {
                    (Ok(a), Ok(b)) => (a, b),
                    _ => return Err(format!("{range:?} is too large")),
                };
                if a > b {
                    return Err(format!("the range {range:?} runs backwards"));
                }
                if b - a >= MAX_NODES as u64 || out.len() + (b - a) as usize >= MAX_NODES {
                    return Err(format!("more than {MAX_NODES} nodes"));
                }
                out.extend((a..=b).map(|n| format!("{n:0width$}")));
            }
            _ => return Err(format!("{range:?} is not a number or a range of numbers")),
        }
    }
    Ok(out)
}

/// This pod's namespace, as Kubernetes mounts it.
const POD_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Workers of a StatefulSet behind a headless Service (`NAME-i.SERVICE.
/// NAMESPACE.svc`), once their names resolve, or why there are none.
fn from_kubernetes(
    options: &Discovery,
    around: &dyn Surroundings,
) -> Result<std::result::Result<Found, String>> {
    let Some(service) = options
        .service
        .clone()
        .or_else(|| around.env(KUBERNETES_SERVICE_ENV))
        .filter(|s| !s.is_empty())
    else {
        return Ok(Err(format!(
            "no Kubernetes service was named ({KUBERNETES_SERVICE_ENV} is not set)"
        )));
    };
    let replicas = match options.replicas {
        Some(n) => n,
        None => {
            let text = around.env(KUBERNETES_REPLICAS_ENV).ok_or_else(|| {
                Error::invalid_argument(format!(
                    "Kubernetes service {service:?}: how many workers? Give replicas or set \
                     {KUBERNETES_REPLICAS_ENV}"
                ))
            })?;
            text.trim().parse().map_err(|_| {
                Error::invalid_argument(format!(
                    "{KUBERNETES_REPLICAS_ENV} {text:?} is not a count"
                ))
            })?
        }
    };
    if replicas == 0 || replicas > MAX_NODES {
        return Err(Error::invalid_argument(format!(
            "Kubernetes replicas must be between 1 and {MAX_NODES}, not {replicas}"
        )));
    }
    let namespace = options
        .namespace
        .clone()
        .or_else(|| around.env(KUBERNETES_NAMESPACE_ENV))
        .or_else(|| {
            around
                .read(POD_NAMESPACE_FILE)
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    let statefulset = around
        .env(KUBERNETES_STATEFULSET_ENV)
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| service.clone());
    let port = options.port.unwrap_or(KUBERNETES_DEFAULT_PORT);
    let names: Vec<String> = (0..replicas)
        .map(|i| format!("{statefulset}-{i}.{service}.{namespace}.svc"))
        .collect();
    // A pod's name is in DNS once it runs: wait for all of them.
    let deadline = Instant::now() + options.timeout;
    let mut addresses = vec![None; names.len()];
    loop {
        for (name, address) in names.iter().zip(addresses.iter_mut()) {
            if address.is_none() {
                *address = around
                    .resolve(name)
                    .first()
                    .map(|ip| join(&ip.to_string(), port));
            }
        }
        let missing: Vec<&str> = names
            .iter()
            .zip(&addresses)
            .filter(|(_, a)| a.is_none())
            .map(|(n, _)| n.as_str())
            .collect();
        if missing.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(Error::unavailable(format!(
                "{} of {replicas} workers of Kubernetes service {service:?} have no DNS name \
                 yet (not running?): {}",
                missing.len(),
                missing.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(Ok(Found {
        addresses: addresses.into_iter().flatten().collect(),
        source: format!("Kubernetes service {service:?} in namespace {namespace:?} (port {port})"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use std::collections::HashMap;

    /// Surroundings of a test: an environment, files and a DNS table.
    #[derive(Default)]
    struct Fake {
        env: HashMap<String, String>,
        files: HashMap<String, String>,
        dns: std::sync::Mutex<HashMap<String, Vec<std::net::IpAddr>>>,
        /// Names that resolve only after this many lookups of theirs.
        late: std::sync::Mutex<HashMap<String, usize>>,
    }

    impl Fake {
        fn with(pairs: &[(&str, &str)]) -> Fake {
            Fake {
                env: pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Fake::default()
            }
        }
    }

    impl Surroundings for Fake {
        fn env(&self, name: &str) -> Option<String> {
            self.env.get(name).cloned()
        }
        fn read(&self, path: &str) -> Option<String> {
            self.files.get(path).cloned()
        }
        fn resolve(&self, host: &str) -> Vec<std::net::IpAddr> {
            let mut late = self.late.lock().unwrap();
            if let Some(left) = late.get_mut(host) {
                if *left > 0 {
                    *left -= 1;
                    return Vec::new();
                }
            }
            self.dns
                .lock()
                .unwrap()
                .get(host)
                .cloned()
                .unwrap_or_default()
        }
    }

    fn expand(list: &str) -> Vec<String> {
        expand_nodelist(list).unwrap_or_else(|e| panic!("{list}: {e}"))
    }

    #[test]
    fn node_lists_expand_as_the_slurm_manual_shows() {
        // The examples of the Slurm documentation (scontrol show hostnames,
        // the hostlist expressions of sbatch and srun).
        assert_eq!(expand("tux[1-3]"), ["tux1", "tux2", "tux3"]);
        assert_eq!(expand("tux[2,4-5]"), ["tux2", "tux4", "tux5"]);
        assert_eq!(
            expand("linux[0-2,128]"),
            ["linux0", "linux1", "linux2", "linux128"]
        );
        assert_eq!(
            expand("a[001-003,7],b1"),
            ["a001", "a002", "a003", "a7", "b1"]
        );
        assert_eq!(expand("lx[08-11]"), ["lx08", "lx09", "lx10", "lx11"]);
        assert_eq!(expand("node1,node2"), ["node1", "node2"]);
        assert_eq!(expand("snowflake"), ["snowflake"]);
        assert_eq!(
            expand("rack[1-2]-node[01-02]"),
            [
                "rack1-node01",
                "rack1-node02",
                "rack2-node01",
                "rack2-node02"
            ]
        );
        assert_eq!(expand("dev[1-2]-ib"), ["dev1-ib", "dev2-ib"]);
        assert_eq!(
            expand("127.0.0.[1-3]"),
            ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        );
        assert_eq!(expand("x[9-10]"), ["x9", "x10"]);
    }

    #[test]
    fn malformed_node_lists_are_refused_saying_why() {
        for (list, why) in [
            ("tux[1-3", "unmatched ["),
            ("tux1-3]", "unmatched ]"),
            ("tux[3-1]", "backwards"),
            ("tux[a-b]", "not a number"),
            ("tux[]", "not a number"),
            ("a,,b", "empty entry"),
            ("", "empty entry"),
            ("n[0-99999999]", "more than"),
            ("n[0-999]x[0-999]", "more than"),
        ] {
            let err = expand_nodelist(list).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidArgument, "{list}");
            assert!(err.message().contains(why), "{list}: {err}");
        }
    }

    #[test]
    fn the_slurm_port_comes_from_the_job_id() {
        assert_eq!(slurm_port(0), 61440);
        assert_eq!(slurm_port(4096 + 5), 61445);
        assert_eq!(slurm_port(u64::MAX), 61440 + 4095);
        let job = Fake::with(&[("SLURM_JOB_ID", "12345")]);
        assert_eq!(worker_port("auto", &job).unwrap(), 61440 + 12345 % 4096);
        assert_eq!(worker_port("7000", &job).unwrap(), 7000);
        let err = worker_port("auto", &Fake::default()).unwrap_err();
        assert!(err.message().contains("SLURM_JOB_ID"), "{err}");
        let err = worker_port("http", &job).unwrap_err();
        assert!(err.message().contains("neither"), "{err}");
        let err = worker_port("auto", &Fake::with(&[("SLURM_JOB_ID", "x")])).unwrap_err();
        assert!(err.message().contains("not a job id"), "{err}");
    }

    #[test]
    fn addresses_given_come_first_then_the_environment_then_slurm() {
        let around = Fake::with(&[
            (WORKERS_ENV, "a:1, b:2"),
            ("SLURM_JOB_NODELIST", "n[1-2]"),
            ("SLURM_JOB_ID", "4097"),
        ]);
        let auto = Discovery::default();
        let given = find_workers(&["x:9".into()], &auto, &around).unwrap();
        assert_eq!(given.addresses, ["x:9"]);
        let env = find_workers(&[], &auto, &around).unwrap();
        assert_eq!(env.addresses, ["a:1", "b:2"]);
        assert_eq!(env.source, WORKERS_ENV);
        let slurm = Discovery {
            cluster: "slurm".into(),
            ..Discovery::default()
        };
        let found = find_workers(&[], &slurm, &around).unwrap();
        assert_eq!(found.addresses, ["n1:61441", "n2:61441"]);
        assert!(found.source.contains("job 4097"), "{}", found.source);
        let other_port = Discovery {
            port: Some(7000),
            ..slurm
        };
        let found = find_workers(&[], &other_port, &around).unwrap();
        assert_eq!(found.addresses, ["n1:7000", "n2:7000"]);
        let err = find_workers(
            &[],
            &Discovery {
                cluster: "mesos".into(),
                ..Discovery::default()
            },
            &around,
        )
        .unwrap_err();
        assert!(err.message().contains("unknown cluster"), "{err}");
        let bad = Fake::with(&[(WORKERS_ENV, "a:1,b")]);
        let err = find_workers(&[], &auto, &bad).unwrap_err();
        assert!(err.message().contains("\"b\" is not HOST:PORT"), "{err}");
    }

    #[test]
    fn nothing_found_lists_where_it_looked() {
        let err = find_workers(&[], &Discovery::default(), &Fake::default()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound);
        for place in [WORKERS_ENV, "SLURM_JOB_NODELIST", KUBERNETES_SERVICE_ENV] {
            assert!(err.message().contains(place), "{place}: {err}");
        }
    }

    #[test]
    fn kubernetes_workers_are_found_by_dns_names_once_they_resolve() {
        let mut around = Fake::with(&[
            (KUBERNETES_SERVICE_ENV, "colocated"),
            (KUBERNETES_REPLICAS_ENV, "3"),
        ]);
        around
            .files
            .insert(POD_NAMESPACE_FILE.into(), "ml\n".into());
        for i in 0..3 {
            around.dns.lock().unwrap().insert(
                format!("colocated-{i}.colocated.ml.svc"),
                vec![format!("127.0.0.{}", i + 1).parse().unwrap()],
            );
        }
        // The last pod is not running yet: its name appears later.
        around
            .late
            .lock()
            .unwrap()
            .insert("colocated-2.colocated.ml.svc".into(), 2);
        let options = Discovery {
            cluster: "kubernetes".into(),
            timeout: Duration::from_secs(10),
            ..Discovery::default()
        };
        let found = find_workers(&[], &options, &around).unwrap();
        assert_eq!(
            found.addresses,
            ["127.0.0.1:61440", "127.0.0.2:61440", "127.0.0.3:61440"]
        );
        assert!(found.source.contains("\"ml\""), "{}", found.source);
        // A name that never appears: the error names it.
        around
            .late
            .lock()
            .unwrap()
            .insert("colocated-1.colocated.ml.svc".into(), usize::MAX);
        let once = Discovery {
            timeout: Duration::ZERO,
            ..options
        };
        let err = find_workers(&[], &once, &around).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unavailable);
        assert!(
            err.message().contains("colocated-1.colocated.ml.svc"),
            "{err}"
        );
        let missing = Fake::with(&[(KUBERNETES_SERVICE_ENV, "colocated")]);
        let err = find_workers(&[], &once, &missing).unwrap_err();
        assert!(err.message().contains(KUBERNETES_REPLICAS_ENV), "{err}");
    }
}
