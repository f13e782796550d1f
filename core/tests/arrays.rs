//! Arrays and shardings: replicated and named layouts, shard shapes and indices,
//! host round trips through the shards, and assembly from per-device buffers.

mod common;

use std::ops::Range;

use colocated_core::*;
use common::*;

/// The elements of block `index` of a row-major array of `shape`, in row-major
/// order, computed independently of the library.
fn block(global: &[u8], shape: &[i64], index: &[Range<i64>], elem: usize) -> Vec<u8> {
    let rank = shape.len();
    let mut out = Vec::new();
    let total: i64 = shape.iter().product();
    for flat in 0..total {
        let mut rest = flat;
        let mut coords = vec![0i64; rank];
        for d in (0..rank).rev() {
            coords[d] = rest % shape[d];
            rest /= shape[d];
        }
        if coords.iter().zip(index).all(|(c, r)| r.contains(c)) {
            let at = flat as usize * elem;
            out.extend_from_slice(&global[at..at + elem]);
        }
    }
    out
}

fn ranges(r: &[(i64, i64)]) -> Vec<Range<i64>> {
    r.iter().map(|&(a, b)| a..b).collect()
}

/// Asserts that shard `i` of an array of `shape` under `sharding` covers
/// the ranges `expected[i]`, for every position.
#[track_caller]
fn assert_shard_indices(sharding: &Sharding, shape: &[i64], expected: &[[(i64, i64); 2]]) {
    for (pos, want) in expected.iter().enumerate() {
        assert_eq!(sharding.shard_index(pos, shape).unwrap(), ranges(want));
    }
}

#[test]
fn replicated_sharding_gives_every_device_the_whole_array() {
    let client = client(4);
    let sharding = Sharding::replicated(client.devices().to_vec()).unwrap();
    assert!(sharding.is_fully_replicated());
    assert_eq!(sharding.devices(), client.devices());
    assert_eq!(sharding.shard_shape(&[3, 5]).unwrap(), vec![3, 5]);
    for pos in 0..4 {
        assert_eq!(
            sharding.shard_index(pos, &[3, 5]).unwrap(),
            ranges(&[(0, 3), (0, 5)])
        );
    }
    let data = i32_bytes(&(0..15).collect::<Vec<_>>());
    let spec = ArraySpec::new(vec![3, 5], DType::I32, sharding).unwrap();
    let array = Array::from_host_bytes(&client, &data, spec).unwrap();
    assert_eq!(array.buffers().len(), 4);
    for (buffer, device) in array.buffers().iter().zip(client.devices()) {
        assert_eq!(buffer.device(), device);
        assert_eq!(buffer.dims(), &[3, 5]);
        assert_eq!(buffer.to_host_vec().unwrap(), data);
    }
    assert_eq!(array.to_host_bytes().unwrap(), data);
    array.ready_event().wait_timeout(PATIENCE).unwrap();
}

#[test]
fn single_device_sharding_holds_the_whole_array_on_one_device() {
    let client = client(2);
    let sharding = Sharding::single_device(client.devices()[1].clone());
    assert!(sharding.is_fully_replicated());
    assert_eq!(sharding.devices(), &client.devices()[1..]);
    assert_eq!(sharding.shard_shape(&[4]).unwrap(), vec![4]);
    assert!(sharding.equivalent(
        &Sharding::replicated(vec![client.devices()[1].clone()]).unwrap(),
        1
    ));
}

#[test]
fn named_sharding_splits_over_x_and_replicates_over_y() {
    // Mesh 2x2 ('x', 'y'), P('x', None): rows split in two, each half on a row of
    // the mesh.
    let client = client(4);
    let sharding = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![0], vec![]]);
    assert!(!sharding.is_fully_replicated());
    assert_eq!(sharding.mesh_shape(), &[2, 2]);
    assert_eq!(sharding.axis_names(), &names(&["x", "y"])[..]);
    assert_eq!(sharding.partition(), &[vec![0]], "trailing None is dropped");
    assert_eq!(sharding.shard_shape(&[4, 6]).unwrap(), vec![2, 6]);
    let expected = [
        [(0, 2), (0, 6)],
        [(0, 2), (0, 6)],
        [(2, 4), (0, 6)],
        [(2, 4), (0, 6)],
    ];
    assert_shard_indices(&sharding, &[4, 6], &expected);
    let data = i32_bytes(&(0..24).collect::<Vec<_>>());
    let spec = ArraySpec::new(vec![4, 6], DType::I32, sharding).unwrap();
    let array = Array::from_host_bytes(&client, &data, spec).unwrap();
    assert_eq!(
        i32_values(&array.buffers()[2].to_host_vec().unwrap()),
        (12..24).collect::<Vec<_>>()
    );
    assert_eq!(array.shard_index(3).unwrap(), ranges(&expected[3]));
    assert_eq!(array.to_host_bytes().unwrap(), data);
}

#[test]
fn named_sharding_splits_the_second_dimension_over_x() {
    // P(None, 'x') on the 2x2 mesh.
    let client = client(4);
    let sharding = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![], vec![0]]);
    assert_eq!(sharding.shard_shape(&[2, 4]).unwrap(), vec![2, 2]);
    assert_eq!(
        sharding.shard_index(1, &[2, 4]).unwrap(),
        ranges(&[(0, 2), (0, 2)])
    );
    assert_eq!(
        sharding.shard_index(2, &[2, 4]).unwrap(),
        ranges(&[(0, 2), (2, 4)])
    );
    let data = i32_bytes(&(0..8).collect::<Vec<_>>());
    let spec = ArraySpec::new(vec![2, 4], DType::I32, sharding).unwrap();
    let array = Array::from_host_bytes(&client, &data, spec).unwrap();
    assert_eq!(
        i32_values(&array.buffers()[3].to_host_vec().unwrap()),
        vec![2, 3, 6, 7]
    );
    assert_eq!(array.to_host_bytes().unwrap(), data);
}

#[test]
fn one_dimension_split_over_two_mesh_axes_is_major_first() {
    let client = client(4);
    // P(('x', 'y')): part = x * 2 + y, i.e. the device position.
    let xy = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![0, 1]]);
    assert_eq!(xy.shard_shape(&[8, 2]).unwrap(), vec![2, 2]);
    for pos in 0..4 {
        let start = pos as i64 * 2;
        assert_eq!(
            xy.shard_index(pos, &[8, 2]).unwrap(),
            ranges(&[(start, start + 2), (0, 2)])
        );
    }
    // P(('y', 'x')): part = y * 2 + x, so positions 1 and 2 trade places.
    let yx = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![1, 0]]);
    let starts: Vec<i64> = (0..4)
        .map(|pos| yx.shard_index(pos, &[8]).unwrap()[0].start)
        .collect();
    assert_eq!(starts, vec![0, 4, 2, 6]);
    assert!(!xy.equivalent(&yx, 1));
}

#[test]
fn two_dimensions_split_over_two_mesh_axes() {
    let client = client(4);
    // P('x', 'y') on [4, 6]: shards of [2, 3].
    let sharding = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![0], vec![1]]);
    assert_eq!(sharding.shard_shape(&[4, 6]).unwrap(), vec![2, 3]);
    let expected = [
        [(0, 2), (0, 3)],
        [(0, 2), (3, 6)],
        [(2, 4), (0, 3)],
        [(2, 4), (3, 6)],
    ];
    assert_shard_indices(&sharding, &[4, 6], &expected);
    // P('y', 'x'): the transpose of the placement.
    let swapped = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![1], vec![0]]);
    assert_eq!(
        swapped.shard_index(1, &[4, 6]).unwrap(),
        ranges(&[(2, 4), (0, 3)])
    );
    assert_eq!(
        swapped.shard_index(2, &[4, 6]).unwrap(),
        ranges(&[(0, 2), (3, 6)])
    );
}

#[test]
fn an_uneven_split_is_invalid_argument() {
    let client = client(4);
    let sharding = mesh_sharding(&client, &[4], &["x"], vec![vec![0]]);
    assert_error(
        sharding.shard_shape(&[6]),
        ErrorCode::InvalidArgument,
        "dimension 0 of size 6 does not split evenly into 4 parts",
    );
    assert_error(
        ArraySpec::new(vec![6, 2], DType::F32, sharding.clone()),
        ErrorCode::InvalidArgument,
        "does not split evenly",
    );
    assert_error(
        sharding.shard_index(0, &[3]),
        ErrorCode::InvalidArgument,
        "does not split evenly",
    );
    let two_axes = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![], vec![0, 1]]);
    assert_error(
        two_axes.shard_shape(&[4, 6]),
        ErrorCode::InvalidArgument,
        "dimension 1 of size 6 does not split evenly into 4 parts",
    );
}

#[test]
fn a_partition_longer_than_the_rank_is_invalid_argument() {
    let client = client(4);
    let sharding = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![0], vec![1]]);
    assert_error(
        sharding.shard_shape(&[4]),
        ErrorCode::InvalidArgument,
        "the partition spec has 2 dimensions but the array has rank 1",
    );
    assert_error(
        ArraySpec::new(vec![], DType::I8, sharding),
        ErrorCode::InvalidArgument,
        "rank 0",
    );
}

#[test]
fn shard_index_of_a_position_out_of_range_is_invalid_argument() {
    let client = client(2);
    let sharding = mesh_sharding(&client, &[2], &["x"], vec![vec![0]]);
    assert_error(
        sharding.shard_index(2, &[4]),
        ErrorCode::InvalidArgument,
        "device position 2 is out of range for 2 devices",
    );
}

#[test]
fn named_sharding_rejects_malformed_meshes_and_partitions() {
    let client = client(4);
    let other = common::client(1);
    let devices = client.devices().to_vec();
    let ia = ErrorCode::InvalidArgument;
    assert_error(
        Sharding::named(vec![], vec![], vec![], vec![]),
        ia,
        "at least one device",
    );
    assert_error(Sharding::replicated(vec![]), ia, "at least one device");
    assert_error(
        Sharding::named(devices.clone(), vec![2, 2], names(&["x"]), vec![]),
        ia,
        "mesh has 2 axes but 1 axis names",
    );
    assert_error(
        Sharding::named(devices.clone(), vec![2, 3], names(&["x", "y"]), vec![]),
        ia,
        "does not hold 4 devices",
    );
    assert_error(
        Sharding::named(devices.clone(), vec![2, 2], names(&["x", "x"]), vec![]),
        ia,
        "mesh axis name 'x' is repeated",
    );
    let repeated = vec![
        devices[0].clone(),
        devices[1].clone(),
        devices[0].clone(),
        devices[3].clone(),
    ];
    assert_error(
        Sharding::named(repeated, vec![4], names(&["x"]), vec![]),
        ia,
        "appears twice",
    );
    assert_error(
        Sharding::named(
            vec![devices[0].clone(), other.devices()[0].clone()],
            vec![2],
            names(&["x"]),
            vec![],
        ),
        ia,
        "must belong to one client",
    );
    assert_error(
        Sharding::named(
            devices.clone(),
            vec![2, 2],
            names(&["x", "y"]),
            vec![vec![2]],
        ),
        ia,
        "partition names mesh axis 2 but the mesh has 2 axes",
    );
    assert_error(
        Sharding::named(
            devices,
            vec![2, 2],
            names(&["x", "y"]),
            vec![vec![0], vec![0]],
        ),
        ia,
        "mesh axis 'x' is used twice",
    );
}

#[test]
fn specs_match_when_shardings_place_the_same_data_on_the_same_devices() {
    let client = client(4);
    let devices = client.devices().to_vec();
    let flat = mesh_sharding(&client, &[4], &["x"], vec![vec![0]]);
    let nested = mesh_sharding(&client, &[2, 2], &["a", "b"], vec![vec![0, 1]]);
    assert!(flat.equivalent(&nested, 1));
    let replicated = Sharding::replicated(devices.clone()).unwrap();
    let named_replicated = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![], vec![]]);
    assert!(named_replicated.is_fully_replicated());
    assert!(replicated.equivalent(&named_replicated, 2));
    assert!(!replicated.equivalent(&flat, 1));
    let reversed: Vec<Device> = devices.iter().rev().cloned().collect();
    let reversed = Sharding::named(reversed, vec![4], names(&["x"]), vec![vec![0]]).unwrap();
    assert!(!flat.equivalent(&reversed, 1));
    assert!(flat.same_device_set(&reversed));

    let a = ArraySpec::new(vec![8], DType::F32, flat.clone()).unwrap();
    let b = ArraySpec::new(vec![8], DType::F32, nested).unwrap();
    assert!(a.matches(&b));
    assert_eq!(a.describe(), "float32[8]");
    let c = ArraySpec::new(vec![8], DType::F64, flat.clone()).unwrap();
    assert!(!a.matches(&c));
    let d = ArraySpec::new(vec![4], DType::F32, flat).unwrap();
    assert!(!a.matches(&d));
}

#[test]
fn from_host_bytes_round_trips_row_major_for_ranks_0_to_3() {
    let client = client(4);
    let one_axis = |p| mesh_sharding(&client, &[4], &["x"], p);
    let two_axes = |p| mesh_sharding(&client, &[2, 2], &["x", "y"], p);
    let cases: Vec<(Vec<i64>, Sharding)> = vec![
        (vec![], Sharding::single_device(client.devices()[2].clone())),
        (
            vec![],
            Sharding::replicated(client.devices().to_vec()).unwrap(),
        ),
        (vec![8], one_axis(vec![vec![0]])),
        (vec![8], two_axes(vec![vec![1, 0]])),
        (vec![0], one_axis(vec![vec![0]])),
        (vec![4, 6], two_axes(vec![vec![0], vec![1]])),
        (vec![4, 6], two_axes(vec![vec![1]])),
        (vec![2, 8], two_axes(vec![vec![], vec![0, 1]])),
        (vec![0, 4], two_axes(vec![vec![], vec![0]])),
        (vec![2, 4, 6], two_axes(vec![vec![0], vec![], vec![1]])),
        (vec![2, 4, 6], two_axes(vec![vec![], vec![1, 0]])),
        (vec![4, 2, 3], one_axis(vec![vec![0]])),
    ];
    for (shape, sharding) in cases {
        for dtype in [DType::U8, DType::I32, DType::F64] {
            let elem = dtype.byte_size().unwrap();
            let n: i64 = shape.iter().product();
            let data: Vec<u8> = (0..n as usize * elem).map(|i| (i % 251) as u8).collect();
            let what = format!("{}{shape:?} {sharding:?}", dtype.name());
            let spec = ArraySpec::new(shape.clone(), dtype, sharding.clone()).unwrap();
            let array = Array::from_host_bytes(&client, &data, spec)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(array.shape(), &shape[..]);
            assert_eq!(array.dtype(), dtype);
            assert!(array.sharding().same_as(&sharding));
            for (pos, buffer) in array.buffers().iter().enumerate() {
                let index = sharding.shard_index(pos, &shape).unwrap();
                assert_eq!(buffer.device(), &sharding.devices()[pos], "{what}");
                assert_eq!(
                    buffer.dims(),
                    &sharding.shard_shape(&shape).unwrap()[..],
                    "{what}"
                );
                assert_eq!(
                    buffer.to_host_vec().unwrap(),
                    block(&data, &shape, &index, elem),
                    "{what}: shard {pos} ({index:?})"
                );
            }
            assert_eq!(array.to_host_bytes().unwrap(), data, "{what}");
        }
    }
}

#[test]
fn from_host_strings_round_trips_and_splits_by_the_sharding() {
    let client = client(4);
    let strings: Vec<String> = (0..12).map(|i| format!("s{i}").repeat(i % 3)).collect();
    let sharding = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![1], vec![0]]);
    let spec = ArraySpec::new(vec![4, 3], DType::String, sharding);
    assert_error(
        spec.map(|_| ()),
        ErrorCode::InvalidArgument,
        "does not split evenly",
    );
    let sharding_2 = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![0, 1]]);
    let spec = ArraySpec::new(vec![4, 3], DType::String, sharding_2).unwrap();
    let array = Array::from_host_strings(&client, &strings, spec).unwrap();
    for (pos, buffer) in array.buffers().iter().enumerate() {
        assert_eq!(buffer.dims(), &[1, 3]);
        assert_eq!(buffer.to_strings().unwrap(), strings[pos * 3..pos * 3 + 3]);
    }
    assert_eq!(array.to_host_strings().unwrap(), strings);

    let columns = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![], vec![]]);
    let spec = ArraySpec::new(vec![2, 6], DType::String, columns).unwrap();
    let array = Array::from_host_strings(&client, &strings, spec).unwrap();
    assert!(array.sharding().is_fully_replicated());
    assert_eq!(array.buffers()[3].to_strings().unwrap(), strings);
    assert_eq!(array.to_host_strings().unwrap(), strings);

    let split_columns = mesh_sharding(&client, &[2], &["x"], vec![vec![], vec![0]]);
    let spec = ArraySpec::new(vec![2, 6], DType::String, split_columns).unwrap();
    let array = Array::from_host_strings(&client, &strings, spec).unwrap();
    let expected: Vec<String> = [0, 1, 2, 6, 7, 8]
        .iter()
        .map(|&i| strings[i].clone())
        .collect();
    assert_eq!(array.buffers()[0].to_strings().unwrap(), expected);
    assert_eq!(array.to_host_strings().unwrap(), strings);

    let replicated = Sharding::replicated(client.devices().to_vec()).unwrap();
    let scalar = ArraySpec::new(vec![], DType::String, replicated).unwrap();
    let array = Array::from_host_strings(&client, &["alone"], scalar).unwrap();
    assert_eq!(array.to_host_strings().unwrap(), vec!["alone"]);
}

#[test]
fn host_conversions_reject_the_wrong_dtype_or_size() {
    let client = client(2);
    let sharding = mesh_sharding(&client, &[2], &["x"], vec![vec![0]]);
    let ints = ArraySpec::new(vec![4], DType::I32, sharding.clone()).unwrap();
    let strings = ArraySpec::new(vec![4], DType::String, sharding).unwrap();
    let ia = ErrorCode::InvalidArgument;
    assert_error(
        Array::from_host_bytes(&client, &[0; 15], ints.clone()),
        ia,
        "data is 15 bytes but int32[4] needs 16",
    );
    assert_error(
        Array::from_host_bytes(&client, &[0; 4], strings.clone()),
        ia,
        "use from_host_strings",
    );
    assert_error(
        Array::from_host_strings(&client, &["a"; 4], ints.clone()),
        ia,
        "needs dtype string",
    );
    assert_error(
        Array::from_host_strings(&client, &["a"; 3], strings.clone()),
        ia,
        "3 strings given but string[4] needs 4",
    );
    let array = Array::from_host_strings(&client, &["a", "b", "c", "d"], strings).unwrap();
    assert_error(array.to_host_bytes(), ia, "use to_host_strings");
    let array = Array::from_host_bytes(&client, &[0; 16], ints).unwrap();
    assert_error(array.to_host_strings(), ia, "is not a string buffer");
}

#[test]
fn assemble_builds_an_array_from_per_device_shards() {
    let client = client(4);
    let spec = x_spec(&client);
    let buffers: Vec<Buffer> = client
        .devices()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let v = i as i32 * 2;
            Buffer::from_bytes(&client, &i32_bytes(&[v, v + 1]), DType::I32, &[2], d).unwrap()
        })
        .collect();
    let array = Array::assemble(spec, buffers.clone()).unwrap();
    assert!(array.buffers()[1].same_as(&buffers[1]));
    assert_eq!(
        i32_values(&array.to_host_bytes().unwrap()),
        (0..8).collect::<Vec<_>>()
    );
}

#[test]
fn assemble_rejects_wrong_device_order_shard_dims_dtype_and_count() {
    let client = client(4);
    let spec = x_spec(&client);
    let shard = |d: usize, dims: &[i64], dtype: DType| {
        let n: i64 = dims.iter().product();
        let size = n as usize * dtype.byte_size().unwrap();
        Buffer::from_bytes(&client, &vec![0; size], dtype, dims, &client.devices()[d]).unwrap()
    };
    let good: Vec<Buffer> = (0..4).map(|d| shard(d, &[2], DType::I32)).collect();
    let ia = ErrorCode::InvalidArgument;

    let mut swapped = good.clone();
    swapped.swap(0, 1);
    assert_error(
        Array::assemble(spec.clone(), swapped),
        ia,
        "buffer 0 is on CpuDevice(id=1) but the sharding puts shard 0 on CpuDevice(id=0)",
    );

    let mut wrong_dims = good.clone();
    wrong_dims[2] = shard(2, &[4], DType::I32);
    assert_error(
        Array::assemble(spec.clone(), wrong_dims),
        ia,
        "buffer 2 is int32[4] but shard 2 of int32[8] is int32[2]",
    );

    let mut wrong_dtype = good.clone();
    wrong_dtype[3] = shard(3, &[2], DType::U32);
    assert_error(
        Array::assemble(spec.clone(), wrong_dtype),
        ia,
        "buffer 3 is uint32[2]",
    );

    assert_error(
        Array::assemble(spec.clone(), good[..3].to_vec()),
        ia,
        "the sharding has 4 devices but 3 buffers were given",
    );
    let mut five = good.clone();
    five.push(shard(0, &[2], DType::I32));
    assert_error(
        Array::assemble(spec.clone(), five),
        ia,
        "but 5 buffers were given",
    );

    let deleted = good.clone();
    deleted[1].delete();
    assert_error(
        Array::assemble(spec, deleted),
        ErrorCode::FailedPrecondition,
        "was deleted",
    );
}

#[test]
fn deleting_an_array_deletes_every_buffer() {
    let client = client(2);
    let sharding = mesh_sharding(&client, &[2], &["x"], vec![vec![0]]);
    let spec = ArraySpec::new(vec![2], DType::U8, sharding).unwrap();
    let array = Array::from_host_bytes(&client, &[1, 2], spec).unwrap();
    assert!(!array.is_deleted());
    array.delete();
    assert!(array.is_deleted());
    assert!(array.buffers().iter().all(Buffer::is_deleted));
    assert_error(
        array.to_host_bytes(),
        ErrorCode::FailedPrecondition,
        "was deleted",
    );
}

#[test]
fn replicas_number_the_copies_of_each_slice_and_point_at_the_first() {
    let client = client(4);
    // Split over 'x' (2), replicated over 'y' (2): devices (x, y) row-major.
    let sharding = mesh_sharding(&client, &[2, 2], &["x", "y"], vec![vec![0]]);
    let replicas = sharding.replicas(&[4]).unwrap();
    let ids: Vec<usize> = replicas.iter().map(|r| r.id).collect();
    let firsts: Vec<usize> = replicas.iter().map(|r| r.first).collect();
    assert_eq!(ids, [0, 1, 0, 1]);
    assert_eq!(firsts, [0, 0, 2, 2]);
    let replicated = Sharding::replicated(client.devices()[..3].to_vec()).unwrap();
    let all: Vec<(usize, usize)> = replicated
        .replicas(&[5])
        .unwrap()
        .iter()
        .map(|r| (r.id, r.first))
        .collect();
    assert_eq!(all, [(0, 0), (1, 0), (2, 0)]);
    assert_error(
        sharding.replicas(&[3]),
        ErrorCode::InvalidArgument,
        "split evenly",
    );
}

#[test]
fn single_device_arrays_assemble_matched_by_device_in_any_order() {
    let client = client(3);
    let devices = client.devices().to_vec();
    let one = |device: &Device, values: &[i32]| {
        let spec = spec_on(&[values.len() as i64], DType::I32, device);
        Array::from_host_bytes(&client, &i32_bytes(values), spec).unwrap()
    };
    let sharding =
        Sharding::named(devices[..2].to_vec(), vec![2], names(&["x"]), vec![vec![0]]).unwrap();
    let spec = ArraySpec::new(vec![4], DType::I32, sharding).unwrap();
    let (a, b) = (one(&devices[0], &[1, 2]), one(&devices[1], &[3, 4]));
    let array =
        Array::from_single_device_arrays(spec.clone(), &[b.clone(), a.clone()], None).unwrap();
    assert_eq!(i32_values(&array.to_host_bytes().unwrap()), [1, 2, 3, 4]);

    let twice = Array::from_single_device_arrays(spec.clone(), &[a.clone(), a.clone()], None);
    assert_error(twice, ErrorCode::InvalidArgument, "two arrays are on");
    let elsewhere = one(&devices[2], &[5, 6]);
    let missing = Array::from_single_device_arrays(spec.clone(), &[a.clone(), elsewhere], None);
    assert_error(
        missing,
        ErrorCode::InvalidArgument,
        "no array is on CpuDevice(id=1)",
    );
    let few = Array::from_single_device_arrays(spec.clone(), std::slice::from_ref(&a), None);
    assert_error(few, ErrorCode::InvalidArgument, "2 devices but 1 arrays");
    let wide = Array::from_single_device_arrays(spec.clone(), &[array.clone(), a.clone()], None);
    assert_error(wide, ErrorCode::InvalidArgument, "single device");
    let kind = Array::from_single_device_arrays(spec, &[a, b], Some(MemoryKind::PinnedHost));
    assert_error(
        kind,
        ErrorCode::InvalidArgument,
        "memory kind is pinned_host",
    );
}

#[test]
fn shardings_are_equal_when_their_meshes_axis_types_and_specs_are() {
    let client = client(4);
    let d = client.devices().to_vec();
    let mesh = |names: [&str; 2], partition: Vec<Vec<usize>>| {
        Sharding::named(
            d[..4].to_vec(),
            vec![2, 2],
            names.iter().map(|n| n.to_string()).collect(),
            partition,
        )
        .unwrap()
    };
    let xy = mesh(["x", "y"], vec![vec![0]]);
    assert!(
        xy == mesh(["x", "y"], vec![vec![0], vec![]]),
        "trailing unsplit dimensions aside"
    );
    let ab = mesh(["a", "b"], vec![vec![0]]);
    assert!(xy.equivalent(&ab, 1), "the same layout");
    assert!(xy != ab, "other axis names");
    let explicit = xy
        .with_axis_types(vec![AxisType::Explicit, AxisType::Auto])
        .unwrap();
    assert_eq!(explicit.axis_types(), [AxisType::Explicit, AxisType::Auto]);
    assert_eq!(xy.axis_types(), [AxisType::Auto, AxisType::Auto]);
    assert!(xy != explicit, "other axis types");
    assert!(xy != mesh(["x", "y"], vec![vec![1]]), "another spec");

    let single = Sharding::single_device(d[0].clone());
    let one_device_mesh =
        Sharding::named(d[..1].to_vec(), vec![1], vec!["replica".into()], vec![]).unwrap();
    assert!(single.is_single_device() && !one_device_mesh.is_single_device());
    assert!(single.equivalent(&one_device_mesh, 1));
    assert!(single != one_device_mesh, "a single device's is no mesh's");
    assert!(single == Sharding::single_device(d[0].clone()));

    let err = xy.with_axis_types(vec![AxisType::Manual]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(err.message(), "mesh has 2 axes but 1 axis types");
    let err = single.with_axis_types(vec![AxisType::Auto]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(AxisType::from_name("Explicit").unwrap(), AxisType::Explicit);
    assert_eq!(
        AxisType::from_name("explicit").unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
}
