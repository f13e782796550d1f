//! Unit tests of worker discovery.

use super::kubernetes::POD_NAMESPACE_FILE;
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
