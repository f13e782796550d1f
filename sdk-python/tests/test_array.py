import math
import operator

import ml_dtypes
import numpy as np
import pytest

import colocated
from colocated import NamedSharding, P, SingleDeviceSharding

STRING = np.dtypes.StringDType()
DTYPES = [
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, ml_dtypes.bfloat16, np.float32, np.float64,
]


def sample(dtype, shape=(4, 2)):
    n = math.prod(shape)
    return (np.arange(n) % 2 == 1 if dtype is np.bool_ else np.arange(n)).astype(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_device_put_round_trips_every_dtype(dtype):
    value = sample(dtype)
    x = colocated.device_put(value, colocated.devices()[1])
    assert isinstance(x, colocated.Array)
    assert x.dtype == np.dtype(dtype)
    assert x.shape == (4, 2) and x.ndim == 2 and x.size == 8
    assert x.sharding == SingleDeviceSharding(colocated.devices()[1])
    back = np.asarray(x)
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, value)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_sharded_round_trips_every_dtype(dtype, mesh):
    value = sample(dtype, (8, 4))
    x = colocated.device_put(value, NamedSharding(mesh, P("x", "y")))
    np.testing.assert_array_equal(np.asarray(x), value)
    assert np.asarray(x).dtype == np.dtype(dtype)


def test_strings_round_trip_single_and_sharded(mesh):
    value = np.array(["", "a", "héllo", "naïve 🙂", "x" * 1000, "b", "c", "d"], dtype=STRING)
    for target in (colocated.devices()[0], NamedSharding(mesh, P(("x", "y")))):
        x = colocated.device_put(value, target)
        assert x.dtype == STRING
        back = np.asarray(x)
        assert back.dtype == STRING
        assert back.tolist() == value.tolist()


def test_fixed_width_unicode_becomes_string_dtype():
    x = colocated.device_put(np.array(["ab", "c"]))
    assert x.dtype == STRING
    assert np.asarray(x).tolist() == ["ab", "c"]


def test_scalars_round_trip():
    assert int(colocated.device_put(7)) == 7
    assert colocated.device_put(7).dtype == np.dtype(np.int64)
    assert float(colocated.device_put(2.5)) == 2.5
    assert bool(colocated.device_put(True)) is True
    assert colocated.device_put(np.float32(1.5)).dtype == np.dtype(np.float32)
    s = colocated.device_put("hi")
    assert s.shape == () and s.dtype == STRING and s.item() == "hi"
    with pytest.raises(TypeError, match="len\\(\\) of unsized object"):
        len(colocated.device_put(1))


def test_zero_size_arrays(mesh):
    for target in (colocated.devices()[0], NamedSharding(mesh, P("x"))):
        x = colocated.device_put(np.zeros((0, 3), np.float32), target)
        assert x.shape == (0, 3)
        back = np.asarray(x)
        assert back.shape == (0, 3) and back.dtype == np.float32
    strings = colocated.device_put(np.array([], dtype=STRING))
    assert np.asarray(strings).shape == (0,)


def test_pytrees_of_values():
    tree = {"a": np.arange(3), "b": [1.5, (True, np.ones(2, np.float16))], "c": None}
    out = colocated.device_put(tree, colocated.devices()[2])
    assert out["c"] is None
    leaves = [out["a"], out["b"][0], out["b"][1][0], out["b"][1][1]]
    assert all(isinstance(x, colocated.Array) for x in leaves)
    assert all(x.sharding.device_set == {colocated.devices()[2]} for x in leaves)
    np.testing.assert_array_equal(np.asarray(out["b"][1][1]), np.ones(2, np.float16))


def test_pytree_of_shardings_as_a_prefix(mesh):
    d = colocated.devices()
    out = colocated.device_put({"a": np.arange(4), "b": [np.arange(2), 3]}, {"a": NamedSharding(mesh, P("x")), "b": d[5]})
    assert out["a"].sharding == NamedSharding(mesh, P("x"))
    assert out["b"][1].sharding == SingleDeviceSharding(d[5])


def test_device_put_of_an_array_with_its_own_sharding_returns_it(mesh):
    s = NamedSharding(mesh, P("x"))
    x = colocated.device_put(np.arange(4), s)
    assert colocated.device_put(x, s) is x
    y = colocated.device_put(x, colocated.devices()[7])
    assert y.sharding == SingleDeviceSharding(colocated.devices()[7])
    np.testing.assert_array_equal(np.asarray(y), np.arange(4))


@pytest.mark.parametrize(
    "spec,expected",
    [
        (P("x"), [(slice(0, 2), slice(0, 4))] * 2 + [(slice(2, 4), slice(0, 4))] * 2),
        (P(None, "x"), [(slice(0, 4), slice(0, 2))] * 2 + [(slice(0, 4), slice(2, 4))] * 2),
        (P(("x", "y")), [(slice(i, i + 1), slice(0, 4)) for i in range(4)]),
        (P("y", "x"), [(slice(0, 2), slice(0, 2)), (slice(2, 4), slice(0, 2)),
                       (slice(0, 2), slice(2, 4)), (slice(2, 4), slice(2, 4))]),
    ],
)
def test_addressable_shards_indices_and_data(mesh, spec, expected):
    value = np.arange(16, dtype=np.float32).reshape(4, 4)
    x = colocated.device_put(value, NamedSharding(mesh, spec))
    shards = x.addressable_shards
    assert [s.device for s in shards] == colocated.devices()[:4]
    assert [s.index for s in shards] == expected
    for s in shards:
        assert s.data.sharding == SingleDeviceSharding(s.device)
        np.testing.assert_array_equal(np.asarray(s.data), value[s.index])
    np.testing.assert_array_equal(np.asarray(x), value)


def test_replica_ids_count_copies_of_the_same_index(mesh):
    x = colocated.device_put(np.arange(4), NamedSharding(mesh, P("x")))
    assert [s.replica_id for s in x.addressable_shards] == [0, 1, 0, 1]


def test_uneven_split_is_an_invalid_argument(mesh4):
    with pytest.raises(colocated.InvalidArgumentError, match="dimension 0 of size 6 does not split evenly into 4 parts") as info:
        colocated.device_put(np.arange(6), NamedSharding(mesh4, P("x")))
    assert isinstance(info.value, ValueError)
    assert info.value.code == "invalid_argument"


def test_unsupported_dtype_is_an_invalid_argument():
    with pytest.raises(colocated.InvalidArgumentError, match="dtype complex128 is not supported"):
        colocated.device_put(np.zeros(2, np.complex128))
    with pytest.raises(colocated.InvalidArgumentError, match="dtype object is not supported"):
        colocated.device_put(np.array([object()]))


def test_bad_target_is_an_invalid_argument():
    with pytest.raises(colocated.InvalidArgumentError, match=r"expected a Sharding or a Device \(colocated.s or JAX.s\), got str"):
        colocated.device_put(np.arange(2), "cpu:0")


def test_array_cannot_be_constructed_directly():
    with pytest.raises(TypeError, match="cannot be constructed directly"):
        colocated.Array()


def test_single_device_conversion_is_zero_copy():
    x = colocated.device_put(np.arange(1000, dtype=np.float64), colocated.devices()[0])
    a, b = np.asarray(x), np.asarray(x)
    assert np.shares_memory(a, b)
    assert not a.flags.writeable
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    assert type(base).__name__ == "HostView"
    copied = np.array(x, copy=True)
    assert not np.shares_memory(copied, a) and copied.flags.writeable


def test_replicated_conversion_is_zero_copy(mesh):
    x = colocated.device_put(np.arange(8), NamedSharding(mesh, P()))
    assert np.shares_memory(np.asarray(x), np.asarray(x))
    assert np.asarray(x).__array__(copy=False) is not None


def test_split_conversion_gathers_and_refuses_copy_false(mesh):
    x = colocated.device_put(np.arange(8), NamedSharding(mesh, P("x")))
    assert not np.shares_memory(np.asarray(x), np.asarray(x))
    with pytest.raises(ValueError, match="split over several buffers"):
        x.__array__(copy=False)
    assert np.asarray(x, dtype=np.float32).dtype == np.float32


def test_views_outlive_delete():
    x = colocated.device_put(np.arange(4.0))
    view = np.asarray(x)
    x.delete()
    assert x.is_deleted()
    np.testing.assert_array_equal(view, np.arange(4.0))
    assert "deleted" in repr(x)
    with pytest.raises(colocated.FailedPreconditionError, match="was deleted"):
        np.asarray(x)


def test_ufuncs_keep_the_sharding(mesh):
    s = NamedSharding(mesh, P(None, "x"))
    value = np.arange(8, dtype=np.float32).reshape(2, 4)
    x = colocated.device_put(value, s)
    for result, expected in [
        (x + 1, value + 1),
        (2 * x, 2 * value),
        (np.sin(x), np.sin(value)),
        (x * x, value * value),
        (x + np.arange(4, dtype=np.float32), value + np.arange(4, dtype=np.float32)),
        (-x, -value),
        (x > 3, value > 3),
    ]:
        assert isinstance(result, colocated.Array)
        assert result.sharding == s
        assert result.dtype == expected.dtype
        np.testing.assert_allclose(np.asarray(result), expected)


OPERATORS = [operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod, operator.pow]


def _numpy_outcome(op, args):
    """numpy's result of ``op(*args)``, or the type of the exception it raises."""
    with np.errstate(all="ignore"):
        try:
            return op(*args)
        except (TypeError, ValueError, OverflowError, ZeroDivisionError) as e:
            return type(e)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (3,), (2, 2)], ids=str)
def test_operators_with_python_scalars_follow_numpy(dtype, shape):
    # Small one-buffer arrays take the native operator fast path (numpy scalar
    # math for rank 0); the result must be what numpy gives for an ndarray.
    value = sample(dtype, shape)
    s = SingleDeviceSharding(colocated.devices()[0])
    x = colocated.device_put(value, s)
    for op in OPERATORS:
        for other in (3, 1.5, True, -2):
            for reflected in (False, True):
                args = (other, value) if reflected else (value, other)
                expected = _numpy_outcome(op, args)
                got_args = (other, x) if reflected else (x, other)
                if isinstance(expected, type):
                    with pytest.raises(expected), np.errstate(all="ignore"):
                        op(*got_args)
                    continue
                with np.errstate(all="ignore"):
                    got = op(*got_args)
                what = f"{op.__name__}{args[0]!r:.20}, {args[1]!r:.20}"
                assert isinstance(got, colocated.Array), what
                assert got.sharding is x.sharding, what
                assert got.shape == np.shape(expected), what
                assert got.dtype == np.asarray(expected).dtype, what
                got_value, expected_value = np.asarray(got), np.asarray(expected)
                if expected_value.dtype == ml_dtypes.bfloat16:  # (NaN compares unequal)
                    got_value, expected_value = got_value.astype(np.float32), expected_value.astype(np.float32)
                np.testing.assert_array_equal(got_value, expected_value, err_msg=what)


NATIVE_OPERATORS = [operator.add, operator.sub, operator.mul, operator.truediv]
INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def _edge_values(dtype):
    """Elements at the edges where numpy overflows, underflows or warns."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return [info.min, info.min + 1, 0, 1, 2, 7, info.max // 2, info.max - 1, info.max] + (
            [-1, -2, -7] if info.min < 0 else []
        )
    info = np.finfo(dtype)
    return [0.0, -0.0, 1.0, -1.5, 0.1, 7.0, info.max, -info.max, info.max / 2, info.smallest_normal,
            info.smallest_normal * 3, info.smallest_subnormal, 1e-30, np.inf, -np.inf, np.nan]


def _edge_operands(dtype):
    """Python scalars at the same edges, and beyond the dtype's range."""
    ints = [0, 1, -1, 2, 3, -7, 2**24, 2**24 + 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1]
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        ints += [int(info.max), int(info.max) + 1, int(info.min), int(info.min) - 1]
    floats = [0.0, -0.0, 0.1, 1.5, -2.25, 1e-300, 1e-40, 1e300, 3.5e38, float("inf"), float("nan")]
    return ints + floats


def _outcome(op, args):
    """``op(*args)`` with every numpy warning raised: the result, or the type
    of the exception."""
    with np.errstate(all="raise"):
        try:
            return op(*args)
        except (ArithmeticError, TypeError, ValueError) as e:
            return type(e)


def _bits(value):
    value = np.asarray(value)
    return value.view(f"u{value.dtype.itemsize}") if value.dtype.kind == "f" else value


@pytest.mark.parametrize("dtype", INT_DTYPES + [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_native_operators_give_numpys_results_warnings_and_errors(dtype):
    # +, -, * and / of a Python scalar are computed without numpy unless numpy
    # would warn or raise; with every warning raised, the outcome is numpy's
    # (a numpy scalar's for rank 0, whose math the fast path used before).
    rng = np.random.default_rng(0)
    values = _edge_values(dtype)
    operands = _edge_operands(dtype)
    if dtype in (np.float32, np.float64):  # rounding: random values and operands
        values += list(rng.standard_normal(24) * 10.0 ** rng.integers(-30, 30, 24))
        operands += [float(v) for v in rng.standard_normal(12) * 10.0 ** rng.integers(-30, 30, 12)]
    device = SingleDeviceSharding(colocated.devices()[0])
    before = colocated._colocated.native_scalar_ops()
    for v in values:
        for shape in [(), (1,)]:
            value = np.full(shape, v, dtype=dtype)
            numpy_value = value[()] if shape == () else value
            x = colocated.device_put(value, device)
            for op in NATIVE_OPERATORS:
                for other in operands:
                    for reflected in (False, True):
                        args = (other, numpy_value) if reflected else (numpy_value, other)
                        expected = _outcome(op, args)
                        got = _outcome(op, (other, x) if reflected else (x, other))
                        what = f"{op.__name__}{'(reflected)' if reflected else ''} {np.dtype(dtype)}{shape} {v!r} {other!r}"
                        if isinstance(expected, type):
                            assert got is expected, what
                            continue
                        assert isinstance(got, colocated.Array), what
                        assert got.dtype == np.asarray(expected).dtype, what
                        assert got.shape == shape, what
                        np.testing.assert_array_equal(_bits(got), _bits(expected), err_msg=what)
    assert colocated._colocated.native_scalar_ops() > before


def test_native_operators_leave_to_numpy_what_numpy_must_decide():
    device = SingleDeviceSharding(colocated.devices()[0])
    x = colocated.device_put(np.array([1, 2], dtype=np.int32), device)
    before = colocated._colocated.native_scalar_ops()
    np.testing.assert_array_equal(np.asarray(x + 1), [2, 3])
    np.testing.assert_array_equal(np.asarray(3 - x), [2, 1])
    np.testing.assert_array_equal(np.asarray(x / 2), [0.5, 1.0])
    assert colocated._colocated.native_scalar_ops() == before + 3
    # numpy's own: an overflow (wraps in an array), an int out of range, a
    # division by zero, a bool operand, floor division, and bool arrays.
    top = colocated.device_put(np.array([2**31 - 1], dtype=np.int32), device)
    np.testing.assert_array_equal(np.asarray(top + 1), [-(2**31)])
    with pytest.raises(OverflowError):
        x + 2**40
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(np.asarray(x / 0), [np.inf, np.inf])
    np.testing.assert_array_equal(np.asarray(x + True), [2, 3])
    np.testing.assert_array_equal(np.asarray(x // 2), [0, 1])
    flags = colocated.device_put(np.array([True, False]), device)
    np.testing.assert_array_equal(np.asarray(flags + 1), [2, 1])
    assert colocated._colocated.native_scalar_ops() == before + 3


def test_operator_fast_path_leaves_large_and_split_arrays_to_numpy(mesh):
    big = np.arange(2048, dtype=np.float32)  # 8 KiB: above the small-value limit
    x = colocated.device_put(big, SingleDeviceSharding(colocated.devices()[0]))
    np.testing.assert_array_equal(np.asarray(x + 1), big + 1)
    split = colocated.device_put(np.arange(8, dtype=np.int32), NamedSharding(mesh, P(("x", "y"))))
    y = 2 - split
    assert y.sharding == split.sharding
    np.testing.assert_array_equal(np.asarray(y), 2 - np.arange(8, dtype=np.int32))
    with pytest.raises(OverflowError):
        split + 2**40


def test_multi_output_ufunc(mesh):
    x = colocated.device_put(np.arange(8.0) + 0.5, NamedSharding(mesh, P(("x", "y"))))
    frac, whole = np.modf(x)
    assert frac.sharding == whole.sharding == x.sharding
    np.testing.assert_array_equal(np.asarray(whole), np.arange(8.0))


def test_ufunc_with_different_layouts_falls_back_to_the_first_layout(mesh):
    a = colocated.device_put(np.ones((4, 4)), NamedSharding(mesh, P("x")))
    b = colocated.device_put(np.ones((4, 4)), NamedSharding(mesh, P(None, "y")))
    c = a + b
    assert c.sharding == a.sharding
    np.testing.assert_array_equal(np.asarray(c), 2 * np.ones((4, 4)))


def test_ufunc_on_different_devices_is_an_invalid_argument():
    a = colocated.device_put(np.ones(2), colocated.devices()[0])
    b = colocated.device_put(np.ones(2), colocated.devices()[1])
    with pytest.raises(colocated.InvalidArgumentError, match="add: the arrays are on different devices"):
        a + b


def test_ufunc_out_argument_is_unsupported():
    a = colocated.device_put(np.ones(2))
    with pytest.raises(TypeError):
        np.add(a, 1, out=np.empty(2))


def test_astype_keeps_the_sharding(mesh):
    x = colocated.device_put(np.arange(4), NamedSharding(mesh, P("x")))
    y = x.astype(ml_dtypes.bfloat16)
    assert y.dtype == np.dtype(ml_dtypes.bfloat16) and y.sharding == x.sharding
    np.testing.assert_array_equal(np.asarray(y).astype(np.float32), np.arange(4, dtype=np.float32))


def test_string_ufunc(mesh):
    x = colocated.device_put(np.array(["a", "b", "c", "d"], dtype=STRING), NamedSharding(mesh, P("x")))
    y = x + "!"
    assert y.sharding == x.sharding
    assert np.asarray(y).tolist() == ["a!", "b!", "c!", "d!"]


def test_make_array_from_callback(mesh):
    value = np.arange(32, dtype=np.int32).reshape(4, 8)
    s = NamedSharding(mesh, P("x", "y"))
    seen = []

    def cb(index):
        seen.append(index)
        return value[index]

    x = colocated.make_array_from_callback(value.shape, s, cb)
    assert x.sharding == s and x.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(x), value)
    assert len(seen) == 4


def test_make_array_from_callback_calls_once_per_distinct_index(mesh):
    calls = []
    x = colocated.make_array_from_callback((4,), NamedSharding(mesh, P("x")), lambda i: calls.append(i) or np.arange(4)[i])
    assert len(calls) == 2
    np.testing.assert_array_equal(np.asarray(x), np.arange(4))


def test_make_array_from_callback_checks_the_shard_shape(mesh):
    with pytest.raises(colocated.InvalidArgumentError, match=r"returned shape \(3,\) for index .* but the shard shape is \(2,\)"):
        colocated.make_array_from_callback((4,), NamedSharding(mesh, P("x")), lambda i: np.zeros(3))


def test_make_array_from_callback_strings(mesh):
    value = np.array(["w", "x", "y", "z"], dtype=STRING)
    x = colocated.make_array_from_callback((4,), NamedSharding(mesh, P(("x", "y"))), lambda i: value[i])
    assert np.asarray(x).tolist() == ["w", "x", "y", "z"]


def test_make_array_from_single_device_arrays(mesh):
    s = NamedSharding(mesh, P(("x", "y")))
    parts = [colocated.device_put(np.full((2, 3), i, np.float32), d) for i, d in enumerate(colocated.devices()[:4])]
    x = colocated.make_array_from_single_device_arrays((8, 3), s, parts[::-1])
    assert x.sharding == s
    np.testing.assert_array_equal(np.asarray(x), np.repeat(np.arange(4, dtype=np.float32), 2)[:, None] * np.ones(3))
    # No copy: the shards are the same buffers.
    assert np.shares_memory(np.asarray(x.addressable_shards[1].data), np.asarray(parts[1]))


def test_make_array_from_shards_of_another_array_round_trips(mesh):
    x = colocated.device_put(np.arange(16).reshape(4, 4), NamedSharding(mesh, P("x", "y")))
    y = colocated.make_array_from_single_device_arrays(x.shape, x.sharding, [s.data for s in x.addressable_shards])
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_make_array_from_single_device_arrays_errors(mesh):
    s = NamedSharding(mesh, P("x"))
    d = colocated.devices()
    parts = [colocated.device_put(np.ones(2), d[i]) for i in range(4)]
    with pytest.raises(colocated.InvalidArgumentError, match="the sharding has 4 devices but 3 arrays were given"):
        colocated.make_array_from_single_device_arrays((4,), s, parts[:3])
    wrong = parts[:3] + [colocated.device_put(np.ones(2), d[6])]
    with pytest.raises(colocated.InvalidArgumentError, match=r"no array is on CpuDevice\(id=3\)"):
        colocated.make_array_from_single_device_arrays((4,), s, wrong)
    with pytest.raises(colocated.InvalidArgumentError, match=r"two arrays are on CpuDevice\(id=0\)"):
        colocated.make_array_from_single_device_arrays((4,), s, [parts[0]] * 4)
    with pytest.raises(colocated.InvalidArgumentError, match=r"buffer 0 is float64\[2\] but shard 0 of float64\[8\] is float64\[4\]"):
        colocated.make_array_from_single_device_arrays((8,), s, parts)
    sharded = colocated.device_put(np.ones(4), s)
    with pytest.raises(colocated.InvalidArgumentError, match="each array must be on a single device"):
        colocated.make_array_from_single_device_arrays((4,), s, [sharded] * 4)


def test_repr_like_jax():
    assert repr(colocated.device_put(np.array([1.0, 2.0], np.float32))) == "Array([1., 2.], dtype=float32)"
    assert repr(colocated.device_put(np.int8(3))) == "Array(3, dtype=int8)"


def test_dlpack_export():
    x = colocated.device_put(np.arange(4, dtype=np.int32))
    assert x.__dlpack_device__() == (1, 0)
    y = np.from_dlpack(x)
    np.testing.assert_array_equal(y, np.arange(4, dtype=np.int32))
