//! The controller's side of discovery: collecting what each host's run
//! reported, and deriving the global output specs from the reports.

use std::sync::{Arc, Mutex};

use prost::Message;

use super::pb;
use super::spec::CallSpec;
use crate::device::{Device, MemoryKind};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::host_callback::LoadedHostCallback;
use crate::sharding::Sharding;
use crate::spec::ArraySpec;

/// Where an output's global spec came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputOrigin {
    /// It has the sharding of input `j` (an SDK may hand the caller's own
    /// sharding object of that input).
    Input(usize),
    /// Its sharding is its own: declared, or made by the function.
    New,
}

/// The outputs of a colocated function's calls of one input spec.
#[derive(Clone, Debug)]
pub struct Outputs {
    /// The language's description of the output tree (from the hosts'
    /// discovery runs; for declared outputs, what the SDK put there).
    pub structure: Vec<u8>,
    /// One global spec per output leaf; its sharding says the kind of
    /// memory the output is in (JAX's sharding's `memory_kind`).
    pub specs: Vec<ArraySpec>,
    /// Where each spec came from.
    pub origins: Vec<OutputOrigin>,
}

impl Outputs {
    /// Declared outputs (JAX's `out_specs_fn`): the language's `structure`
    /// and one spec per leaf, each a sharding of its own.
    pub fn declared(structure: Vec<u8>, specs: Vec<ArraySpec>) -> Outputs {
        Outputs {
            structure,
            origins: vec![OutputOrigin::New; specs.len()],
            specs,
        }
    }
}

/// The reports of one discovery run, as the hosts' calls of its host
/// callback deliver them (on several threads at once).
#[derive(Clone, Default)]
pub(crate) struct Reports(Arc<Mutex<Vec<Result<pb::Report>>>>);

impl Reports {
    /// The host callback the hosts report through.
    pub fn callback(&self) -> LoadedHostCallback {
        let reports = self.0.clone();
        LoadedHostCallback::new("colocated discovery report", move |bytes: &[u8]| {
            let report = pb::Report::decode(bytes)
                .map_err(|e| Error::invalid_argument(format!("malformed discovery report: {e}")));
            reports
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(report);
            Ok(Vec::new())
        })
    }

    /// The global outputs of a call of `call` on `devices` (see the rules in
    /// the module docs of `colocated`), checked to agree across hosts.
    /// `same(a, b)` says whether two hosts' structures are the same (the
    /// language's rule; their bytes may differ).
    pub fn outputs(
        &self,
        call: &CallSpec,
        devices: &[Device],
        same: &dyn Fn(&[u8], &[u8]) -> bool,
    ) -> Result<Outputs> {
        let reports = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        global_outputs(&reports, call, &by_host(devices), same)
    }
}

/// The call's devices per host, hosts in order of first appearance.
pub(super) fn by_host(devices: &[Device]) -> Vec<Vec<Device>> {
    let mut hosts: Vec<Vec<Device>> = Vec::new();
    for d in devices {
        match hosts
            .iter_mut()
            .find(|h| h[0].host_index() == d.host_index())
        {
            Some(h) => h.push(d.clone()),
            None => hosts.push(vec![d.clone()]),
        }
    }
    hosts
}

/// The global outputs of a call of `call` whose devices on each host are
/// `hosts` (hosts in order), from the hosts' `reports`.
pub(super) fn global_outputs(
    reports: &[pb::Report],
    call: &CallSpec,
    hosts: &[Vec<Device>],
    same: &dyn Fn(&[u8], &[u8]) -> bool,
) -> Result<Outputs> {
    if reports.is_empty() || reports.len() != hosts.len() {
        return Err(Error::internal(format!(
            "{} of {} hosts reported their outputs during discovery",
            reports.len(),
            hosts.len()
        )));
    }
    let first = &reports[0];
    if reports
        .iter()
        .skip(1)
        .any(|r| !same(&r.structure, &first.structure))
    {
        return Err(Error::invalid_argument(
            "the colocated function returned different structures on different hosts",
        ));
    }
    if reports
        .iter()
        .any(|r| r.outputs.len() != first.outputs.len())
    {
        return Err(Error::invalid_argument(
            "the colocated function returned different numbers of arrays on different hosts",
        ));
    }
    let mut specs = Vec::with_capacity(first.outputs.len());
    let mut origins = Vec::with_capacity(first.outputs.len());
    for (k, out) in first.outputs.iter().enumerate() {
        if reports.iter().any(|r| &r.outputs[k] != out) {
            return Err(Error::invalid_argument(format!(
                "output {k} differs in shape, dtype, sharding or memory kind between hosts; give the function out_specs_fn"
            )));
        }
        let dtype = DType::from_u32(out.dtype)?;
        if let Some(j) = out.same_as_input {
            specs.push(input_spec(k, j, out, dtype, call)?);
            origins.push(OutputOrigin::Input(j as usize));
            continue;
        }
        let layout = out.layout.as_ref().ok_or_else(|| {
            Error::invalid_argument(format!("output {k} was reported without its sharding"))
        })?;
        let mut spec = match from_layout(k, layout, &out.shape, hosts) {
            Ok((shape, sharding)) => ArraySpec::new(shape, dtype, sharding)?,
            // Hosts' arrays that are no blocks of one, each with the layout
            // of an input: an array with that input's global layout (under
            // the input's mesh names, which say how the hosts' parts join).
            Err(e) => match out.layout_of_input {
                Some(j) => input_spec(k, j, out, dtype, call)?,
                None => return Err(e),
            },
        };
        // The memory the hosts made it in (older hosts do not say: 0).
        if let Some(kind) = MemoryKind::from_u32(out.memory_kind) {
            spec.sharding = spec.sharding.with_memory_kind(Some(kind))?;
        }
        specs.push(spec);
        origins.push(OutputOrigin::New);
    }
    Ok(Outputs {
        structure: first.structure.clone(),
        specs,
        origins,
    })
}

/// The global spec of output `k` (reported as `out`), which has the layout of
/// input `j` on every host: each host's part of the input is the same
/// fraction of it.
fn input_spec(
    k: usize,
    j: u32,
    out: &pb::OutputReport,
    dtype: DType,
    call: &CallSpec,
) -> Result<ArraySpec> {
    let x = call.leaves.get(j as usize).ok_or_else(|| {
        Error::invalid_argument(format!("output {k} names input {j}, which the call lacks"))
    })?;
    if x.shape.len() != out.shape.len() || out.input_shape.len() != out.shape.len() {
        return Err(Error::invalid_argument(format!(
            "output {k} has another rank than input {j}"
        )));
    }
    let shape = out
        .shape
        .iter()
        .zip(&x.shape)
        .zip(&out.input_shape)
        .map(|((&o, &g), &n)| match g.checked_div(n) {
            Some(ratio) if n > 0 => o.checked_mul(ratio),
            _ => Some(o),
        })
        .collect::<Option<Vec<i64>>>()
        .ok_or_else(|| Error::invalid_argument(format!("output {k}'s global shape overflows")))?;
    ArraySpec::new(shape, dtype, x.sharding.clone())
}

/// The global array of an output that every host made with the same layout
/// over its devices of the call. On one host it is that array. On several
/// hosts each made a block of it over all of its devices: the hosts' meshes
/// stack along the first mesh axis, in host order, and dimensions split over
/// that axis grow by the number of hosts (as JAX assembles an array from each
/// process's local data).
fn from_layout(
    k: usize,
    layout: &pb::HostLayout,
    shape: &[i64],
    hosts: &[Vec<Device>],
) -> Result<(Vec<i64>, Sharding)> {
    let unknown = |why: &str| {
        Error::invalid_argument(format!(
            "output {k} has the sharding of none of the inputs and {why}, so its global spec is unknown; \
             give the function out_specs_fn"
        ))
    };
    if hosts.iter().any(|h| layout.positions.len() > h.len()) {
        return Err(unknown("names more devices than a host has in the call"));
    }
    let mut devices = Vec::new();
    for host in hosts {
        for &p in &layout.positions {
            devices.push(
                host.get(p as usize)
                    .cloned()
                    .ok_or_else(|| unknown("names a device the host lacks"))?,
            );
        }
    }
    let mut mesh_shape: Vec<usize> = layout.mesh_shape.iter().map(|&n| n as usize).collect();
    let partition: Vec<Vec<usize>> = layout
        .partition
        .iter()
        .map(|a| a.mesh_axes.iter().map(|&x| x as usize).collect())
        .collect();
    let mut shape = shape.to_vec();
    let n = hosts.len();
    if n > 1 {
        if hosts.iter().any(|h| h.len() != layout.positions.len()) {
            return Err(unknown("does not span each host's devices of the call"));
        }
        let overflow = || Error::invalid_argument(format!("output {k}'s global shape overflows"));
        let Some(first) = mesh_shape.first_mut() else {
            return Err(unknown("has a mesh without axes"));
        };
        // Blocks stack along a dimension split over the first mesh axis;
        // without one, the hosts' arrays would claim to be copies of each
        // other, which nothing checks.
        if !partition.iter().any(|axes| axes.contains(&0)) {
            return Err(unknown(
                "splits no dimension over its first mesh axis (the hosts' arrays are not blocks of one)",
            ));
        }
        *first = first.checked_mul(n).ok_or_else(overflow)?;
        for (dim, axes) in partition.iter().enumerate() {
            if axes.contains(&0) {
                if let Some(d) = shape.get_mut(dim) {
                    *d = d.checked_mul(n as i64).ok_or_else(overflow)?;
                }
            }
        }
    }
    // On several hosts the stacked blocks make a mesh, whatever each host's
    // own sharding was.
    let sharding = Sharding::from_wire(
        devices,
        mesh_shape,
        layout.axis_names.clone(),
        &layout.axis_types,
        layout.mesh || n > 1,
        partition,
        0,
    )?;
    Ok((shape, sharding))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Client, ClientOptions};
    use crate::error::ErrorCode;
    use crate::sharding::AxisType;

    fn report(
        shape: Vec<i64>,
        layout: pb::HostLayout,
        same_as_input: Option<u32>,
        input_shape: Vec<i64>,
    ) -> pb::Report {
        pb::Report {
            structure: vec![1],
            outputs: vec![pb::OutputReport {
                shape,
                dtype: crate::dtype::DType::I32 as u32,
                layout: Some(layout),
                same_as_input,
                input_shape,
                ..Default::default()
            }],
        }
    }

    fn layout(positions: Vec<u32>, mesh: Vec<u64>) -> pb::HostLayout {
        pb::HostLayout {
            positions,
            mesh_shape: mesh,
            axis_names: vec!["x".into()],
            partition: vec![pb::Axes { mesh_axes: vec![0] }],
            ..Default::default()
        }
    }

    #[test]
    fn a_reported_output_keeps_its_mesh_names_axis_types_and_memory_kind() {
        let client = Client::new_local(ClientOptions {
            num_cpu_devices: Some(2),
            executor_threads: Some(1),
            ..Default::default()
        })
        .unwrap();
        let devices = client.devices().to_vec();
        let x = ArraySpec::new(
            vec![2],
            DType::I32,
            Sharding::single_device(devices[0].clone()),
        )
        .unwrap();
        let call = CallSpec {
            tree: 0,
            leaves: vec![x],
        };
        let one_device = |layout: pb::HostLayout, memory_kind: u32| pb::Report {
            structure: vec![1],
            outputs: vec![pb::OutputReport {
                shape: vec![2],
                dtype: DType::I32 as u32,
                layout: Some(layout),
                memory_kind,
                ..Default::default()
            }],
        };
        let hosts = [devices[..1].to_vec()];
        let same = |a: &[u8], b: &[u8]| a == b;
        // A one-device mesh with an Explicit axis, in pinned host memory.
        let layout = pb::HostLayout {
            positions: vec![0],
            mesh_shape: vec![1],
            axis_names: vec!["x".into()],
            axis_types: vec![AxisType::Explicit as u32],
            mesh: true,
            ..Default::default()
        };
        let report = one_device(layout.clone(), MemoryKind::PinnedHost as u32);
        let outputs = global_outputs(&[report], &call, &hosts, &same).unwrap();
        let made = Sharding::named(devices[..1].to_vec(), vec![1], vec!["x".into()], vec![])
            .and_then(|s| s.with_axis_types(vec![AxisType::Explicit]))
            .and_then(|s| s.with_memory_kind(Some(MemoryKind::PinnedHost)))
            .unwrap();
        assert!(outputs.specs[0].sharding == made, "{:?}", outputs.specs[0]);
        assert_eq!(
            outputs.specs[0].sharding.memory_kind(),
            Some(MemoryKind::PinnedHost)
        );

        // An older host says neither axis types, nor mesh, nor memory kind:
        // one device unsplit is a single device's, other axes are Auto.
        let old = pb::HostLayout {
            axis_types: vec![],
            mesh: false,
            ..layout
        };
        let outputs = global_outputs(&[one_device(old.clone(), 0)], &call, &hosts, &same).unwrap();
        assert!(outputs.specs[0].sharding == Sharding::single_device(devices[0].clone()));
        assert_eq!(outputs.specs[0].sharding.memory_kind(), None);
        let split = pb::HostLayout {
            positions: vec![0, 1],
            mesh_shape: vec![2],
            partition: vec![pb::Axes { mesh_axes: vec![0] }],
            ..old
        };
        let outputs = global_outputs(
            &[one_device(split, 0)],
            &call,
            std::slice::from_ref(&devices),
            &same,
        )
        .unwrap();
        let s = &outputs.specs[0].sharding;
        assert!(!s.is_single_device());
        assert_eq!(s.axis_names(), ["x"]);
        assert_eq!(s.axis_types(), [AxisType::Auto]);

        // A type no AxisType has is refused.
        let bad = pb::HostLayout {
            axis_types: vec![7],
            ..Default::default()
        };
        let bad = pb::HostLayout {
            positions: vec![0],
            mesh_shape: vec![1],
            axis_names: vec!["x".into()],
            mesh: true,
            ..bad
        };
        let err = global_outputs(&[one_device(bad, 0)], &call, &hosts, &same).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    }

    #[test]
    fn hostile_or_inconsistent_reports_get_errors_not_panics() {
        let client = Client::new_local(ClientOptions {
            num_cpu_devices: Some(2),
            executor_threads: Some(1),
            ..Default::default()
        })
        .unwrap();
        let devices = client.devices().to_vec();
        let sharding = Sharding::replicated(devices.clone()).unwrap();
        let x = crate::spec::ArraySpec::new(vec![4], crate::dtype::DType::I32, sharding).unwrap();
        let call = CallSpec {
            tree: 0,
            leaves: vec![x],
        };
        let cases = [
            // A huge output from a host holding 1 of 4 elements: the product overflows.
            report(
                vec![i64::MAX],
                layout(vec![0, 1], vec![2]),
                Some(0),
                vec![1],
            ),
            // A mesh as big as usize can hold.
            report(vec![2], layout(vec![0, 1], vec![u64::MAX]), None, vec![]),
            // A device the host lacks, an input the call lacks, no layout.
            report(vec![2], layout(vec![7], vec![1]), None, vec![]),
            report(vec![2], layout(vec![0], vec![1]), Some(9), vec![2]),
            pb::Report {
                structure: vec![],
                outputs: vec![pb::OutputReport::default()],
            },
        ];
        for (i, r) in cases.into_iter().enumerate() {
            let err = global_outputs(&[r], &call, std::slice::from_ref(&devices), &|a, b| a == b)
                .unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidArgument, "case {i}: {err}");
        }
        let err =
            global_outputs(&[], &call, std::slice::from_ref(&devices), &|a, b| a == b).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Internal, "{err}");
    }
}
