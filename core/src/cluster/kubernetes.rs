//! Workers of a Kubernetes StatefulSet behind a headless Service, found by
//! their pods' DNS names (no API access).

use std::time::{Duration, Instant};

use super::{
    join, Discovery, Found, Surroundings, KUBERNETES_DEFAULT_PORT, KUBERNETES_NAMESPACE_ENV,
    KUBERNETES_REPLICAS_ENV, KUBERNETES_SERVICE_ENV, KUBERNETES_STATEFULSET_ENV, MAX_NODES,
};
use crate::error::{Error, Result};

/// This pod's namespace, as Kubernetes mounts it.
pub(super) const POD_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Workers of a StatefulSet behind a headless Service (`NAME-i.SERVICE.
/// NAMESPACE.svc`), once their names resolve, or why there are none.
pub(super) fn from_kubernetes(
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
