//! Workers of a Slurm job: the job's node list, expanded, and the port
//! derived from the job id.

use super::{join, Discovery, Found, Surroundings, MAX_NODES, SLURM_PORT_BASE};
use crate::error::{Error, Result};

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
pub(super) fn from_slurm(
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
