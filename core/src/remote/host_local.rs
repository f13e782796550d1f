//! The host-local form of a program: for each input and output, the shards on
//! one host and the shape of the block they cover.

use super::RemoteHost;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::format::pb;
use crate::program::Program;
use crate::sharding::Sharding;
use crate::spec::ArraySpec;

/// How one host's part of a program is laid out: for each input and output,
/// the positions (in the global sharding's device order) of the host's shards,
/// in the order of the host-local sharding's devices.
pub(crate) struct HostLocal {
    pub input_positions: Vec<Vec<usize>>,
    pub output_positions: Vec<Vec<usize>>,
    /// The serialized host-local program, in the worker's device ids.
    pub executable: pb::Executable,
}

/// The host-local form of `program` for `host` (see the module docs).
/// `unimplemented` when a spec's shards on the host do not form one block of
/// the mesh and of the array, or the worker cannot hold a spec's dtype.
pub(crate) fn host_local(
    program: &Program,
    host: &RemoteHost,
    host_index: usize,
    num_host_callbacks: usize,
) -> Result<HostLocal> {
    let locals = |specs: &[ArraySpec], what: &str| -> Result<(Vec<_>, Vec<_>)> {
        let locals = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                local_spec(spec, host_index, &|d| host.local_id(d))
                    .map_err(|e| e.context(format!("{what} {i} on {}", host.session.address())))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(locals.into_iter().unzip())
    };
    for spec in program.input_specs.iter().chain(&program.output_specs) {
        host.check_dtype(spec.dtype)?;
    }
    let (input_specs, input_positions) = locals(&program.input_specs, "input")?;
    let (output_specs, output_positions) = locals(&program.output_specs, "output")?;
    let device_ids = program
        .devices
        .iter()
        .filter(|d| d.host_index() == host_index)
        .map(|d| host.local_id(d))
        .collect::<Result<Vec<_>>>()?;
    Ok(HostLocal {
        input_positions,
        output_positions,
        executable: pb::Executable {
            name: program.name.clone(),
            language: program.language.clone(),
            payload: program.payload.clone(),
            input_specs,
            output_specs,
            device_ids,
            num_host_callbacks: num_host_callbacks as u32,
            platform_name: crate::device::PLATFORM_NAME.to_string(),
            output_structure: program.output_structure.clone(),
        },
    })
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut coords = vec![0; shape.len()];
    for (c, n) in coords.iter_mut().zip(shape).rev() {
        *c = i % n;
        i /= n;
    }
    coords
}

fn ravel(coords: &[usize], shape: &[usize]) -> usize {
    coords.iter().zip(shape).fold(0, |acc, (c, n)| acc * n + c)
}

/// The block index along one array dimension split over mesh axes `axes`.
fn block(coords: &[usize], mesh: &[usize], axes: &[usize]) -> usize {
    axes.iter().fold(0, |acc, &a| acc * mesh[a] + coords[a])
}

/// `spec` restricted to the shards of host `host_index`, with the devices
/// named by `device_id`, and their global positions in the local sharding's
/// device order (the sharding's own order, filtered).
pub(crate) fn local_spec(
    spec: &ArraySpec,
    host_index: usize,
    device_id: &dyn Fn(&Device) -> Result<u32>,
) -> Result<(pb::ArraySpec, Vec<usize>)> {
    let sharding: &Sharding = &spec.sharding;
    let mesh = sharding.mesh_shape();
    let devices = sharding.devices();
    let mine: Vec<usize> = (0..devices.len())
        .filter(|&i| devices[i].host_index() == host_index)
        .collect();
    if mine.is_empty() {
        return Err(Error::internal("the host has no shard of the spec"));
    }
    // The box of mesh coordinates the host's devices cover.
    let mut lo = vec![usize::MAX; mesh.len()];
    let mut hi = vec![0usize; mesh.len()];
    for &i in &mine {
        for (a, c) in unravel(i, mesh).into_iter().enumerate() {
            lo[a] = lo[a].min(c);
            hi[a] = hi[a].max(c + 1);
        }
    }
    let local_mesh: Vec<usize> = lo.iter().zip(&hi).map(|(l, h)| h - l).collect();
    if local_mesh.iter().product::<usize>() != mine.len() {
        return Err(Error::unimplemented(
            "the host's devices do not form one block of the mesh",
        ));
    }
    // Positions in local (row-major over the box) order.
    let positions: Vec<usize> = (0..mine.len())
        .map(|j| {
            let local = unravel(j, &local_mesh);
            let global: Vec<usize> = local.iter().zip(&lo).map(|(c, l)| c + l).collect();
            ravel(&global, mesh)
        })
        .collect();
    // Each dimension's blocks on the host must be a run of the global blocks,
    // in the same order.
    let partition = sharding.partition();
    let shard = sharding.shard_shape(&spec.shape)?;
    let mut shape = spec.shape.clone();
    for (d, axes) in partition.iter().enumerate() {
        let mut offset = None;
        for (j, &p) in positions.iter().enumerate() {
            let global = block(&unravel(p, mesh), mesh, axes);
            let local = block(&unravel(j, &local_mesh), &local_mesh, axes);
            match offset {
                None => offset = Some(global as i64 - local as i64),
                Some(o) if o == global as i64 - local as i64 => {}
                Some(_) => {
                    return Err(Error::unimplemented(format!(
                        "the host's shards of dimension {d} are not one block of the array"
                    )))
                }
            }
        }
        let blocks: usize = axes.iter().map(|&a| local_mesh[a]).product();
        shape[d] = shard[d] * blocks as i64;
    }
    let device_ids = positions
        .iter()
        .map(|&p| device_id(&devices[p]))
        .collect::<Result<Vec<_>>>()?;
    let local = pb::ArraySpec {
        dtype: spec.dtype as u32,
        shape,
        sharding: Some(pb::Sharding {
            device_ids,
            mesh_shape: local_mesh.iter().map(|n| *n as u64).collect(),
            axis_names: sharding.axis_names().to_vec(),
            partition: partition
                .iter()
                .map(|axes| pb::DimPartition {
                    mesh_axes: axes.iter().map(|a| *a as u32).collect(),
                })
                .collect(),
            axis_types: sharding.wire_axis_types(),
            mesh: !sharding.is_single_device(),
            memory_kind: sharding.wire_memory_kind(),
        }),
    };
    Ok((local, positions))
}
