"""What the native module calls in this package, handed to it once, at import
(``_colocated._register_hooks``): it imports no private name of the package
and looks each up once."""

from . import _colocated
from ._array import Array, _wrap
from ._client import _reduce_device, _register
from ._colocated_python import _load_program
from ._dtypes import _FROM_CORE
from ._errors import ColocatedError, _from_core
from ._streams import is_pool_thread, work_item_scope

_colocated._register_hooks(
    array_type=Array,
    wrap_array=_wrap,
    error_from_core=_from_core,
    error_type=ColocatedError,
    is_pool_thread=is_pool_thread,
    work_item_scope=work_item_scope,
    reduce_device=_reduce_device,
    numpy_dtypes=_FROM_CORE,
    load_program=_load_program,
    register_client=_register,
)
