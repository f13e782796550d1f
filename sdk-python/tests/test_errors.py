import pytest

import colocated
from colocated import _errors

BUILTINS = {
    "cancelled": (colocated.CancelledError, None),
    "invalid_argument": (colocated.InvalidArgumentError, ValueError),
    "deadline_exceeded": (colocated.DeadlineExceededError, TimeoutError),
    "not_found": (colocated.NotFoundError, LookupError),
    "already_exists": (colocated.AlreadyExistsError, None),
    "permission_denied": (colocated.PermissionDeniedError, PermissionError),
    "resource_exhausted": (colocated.ResourceExhaustedError, MemoryError),
    "failed_precondition": (colocated.FailedPreconditionError, RuntimeError),
    "unimplemented": (colocated.UnimplementedError, NotImplementedError),
    "internal": (colocated.InternalError, RuntimeError),
    "unavailable": (colocated.UnavailableError, ConnectionError),
    "unauthenticated": (colocated.UnauthenticatedError, PermissionError),
}


@pytest.mark.parametrize("code", sorted(BUILTINS))
def test_each_code_maps_to_its_class_and_builtin(code):
    cls, builtin = BUILTINS[code]
    err = _errors._from_core(code, "boom", None)
    assert type(err) is cls
    assert isinstance(err, colocated.ColocatedError)
    if builtin is not None:
        assert isinstance(err, builtin)
    assert err.code == code
    assert str(err) == "boom"


def test_remote_errors_carry_the_traceback_and_code():
    err = _errors._from_core("internal", "user code failed", "Traceback...\nZeroDivisionError")
    assert type(err) is colocated.RemoteError
    assert err.code == "internal"
    assert err.remote_traceback == "Traceback...\nZeroDivisionError"
    assert "Remote traceback:\nTraceback...\nZeroDivisionError" in str(err)


def test_core_errors_arrive_as_typed_exceptions():
    with pytest.raises(colocated.NotFoundError, match="no device with id 99") as info:
        colocated.client().device(99)
    assert isinstance(info.value, LookupError)
    assert info.value.code == "not_found"
