//! Handle tags, argument checks and the versioned-struct reader shared by every
//! export.

use std::ffi::CStr;

use colocated_core::{Error, Result};

/// A borrowed UTF-8 string: pointer and byte length. Strings the library returns
/// are also NUL-terminated (the NUL is not counted in `size`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct colocated_string_view {
    /// First byte; may be NULL when `size` is 0.
    pub data: *const std::os::raw::c_char,
    /// Length in bytes.
    pub size: usize,
}

impl colocated_string_view {
    pub(crate) fn empty() -> Self {
        colocated_string_view {
            data: c"".as_ptr(),
            size: 0,
        }
    }

    pub(crate) fn of_cstr(s: &CStr) -> Self {
        colocated_string_view {
            data: s.as_ptr(),
            size: s.to_bytes().len(),
        }
    }

    /// Reads a caller's view as UTF-8.
    ///
    /// # Safety
    /// `data` is valid for `size` bytes (or NULL with size 0).
    pub(crate) unsafe fn to_str<'a>(self, what: &str) -> Result<&'a str> {
        if self.size == 0 {
            return Ok("");
        }
        if self.data.is_null() {
            return Err(Error::invalid_argument(format!(
                "{what} is NULL with size {}",
                self.size
            )));
        }
        std::str::from_utf8(std::slice::from_raw_parts(
            self.data.cast::<u8>(),
            self.size,
        ))
        .map_err(|e| Error::invalid_argument(format!("{what} is not UTF-8: {e}")))
    }
}

/// Implemented by every handle type: a `#[repr(C)]` struct whose first field is a
/// `u64` tag, so a handle of the wrong type (or one already destroyed, while its
/// memory has not been reused) is detected before use.
pub(crate) trait Tagged {
    const TAG: u64;
    const NAME: &'static str;
}

pub(crate) const DEAD_TAG: u64 = 0xdead_dead_dead_dead;

macro_rules! tagged {
    ($($t:ty => $tag:expr),* $(,)?) => {
        $(impl crate::handle::Tagged for $t {
            const TAG: u64 = $tag;
            const NAME: &'static str = stringify!($t);
        })*
    };
}
pub(crate) use tagged;

/// Borrows a handle after checking it is non-NULL and of type `T`.
///
/// # Safety
/// `ptr` is NULL or points to at least 8 readable bytes.
pub(crate) unsafe fn handle<'a, T: Tagged>(ptr: *const T, what: &str) -> Result<&'a T> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!(
            "{what} ({}) is NULL",
            T::NAME
        )));
    }
    let tag = std::ptr::read(ptr.cast::<u64>());
    if tag != T::TAG && tag != T::TAG ^ BORROWED {
        return Err(Error::invalid_argument(format!(
            "{what} is not a live {} (wrong handle type, or destroyed)",
            T::NAME
        )));
    }
    Ok(&*ptr)
}

/// Flips a tag into its "borrowed" form: handles the library lends for the duration
/// of a call (a native function's inputs and client) work everywhere, but their
/// `*_destroy` is a no-op instead of freeing memory the caller does not own.
pub(crate) const BORROWED: u64 = 0xff;

/// Marks a handle as lent (see [`BORROWED`]).
pub(crate) fn lend<T: Tagged>(tag: &mut u64) {
    *tag = T::TAG ^ BORROWED;
}

/// Takes back a boxed handle for destruction (NULL and wrong types are ignored).
///
/// # Safety
/// `ptr` is NULL or a handle made by `Box::into_raw` and not used afterwards.
pub(crate) unsafe fn take<T: Tagged>(ptr: *mut T) -> Option<Box<T>> {
    if ptr.is_null() || std::ptr::read(ptr.cast::<u64>()) != T::TAG {
        return None;
    }
    std::ptr::write(ptr.cast::<u64>(), DEAD_TAG);
    Some(Box::from_raw(ptr))
}

/// Writes an out-parameter, or fails with `invalid_argument` if it is NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid_argument(format!(
            "out-parameter {what} is NULL"
        )));
    }
    std::ptr::write(out, value);
    Ok(())
}

/// Boxes `value` into `*out` (the caller then owns it), or fails and drops
/// `value` when `out` is NULL: nothing leaks either way.
///
/// # Safety
/// `out` is NULL or valid for a write of a pointer.
pub(crate) unsafe fn put_box<T>(out: *mut *mut T, value: T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid_argument(format!(
            "out-parameter {what} is NULL"
        )));
    }
    std::ptr::write(out, Box::into_raw(Box::new(value)));
    Ok(())
}

/// Borrows `len` items at `ptr` (NULL allowed when `len` is 0).
///
/// # Safety
/// `ptr` is valid for `len` reads of `T`.
pub(crate) unsafe fn slice<'a, T>(ptr: *const T, len: usize, what: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!(
            "{what} is NULL but its count is {len}"
        )));
    }
    if len > isize::MAX as usize / std::mem::size_of::<T>().max(1) {
        return Err(Error::invalid_argument(format!(
            "{what} has an impossible count ({len})"
        )));
    }
    if (ptr as usize) % std::mem::align_of::<T>() != 0 {
        return Err(Error::invalid_argument(format!(
            "{what} is not aligned for its element type"
        )));
    }
    Ok(std::slice::from_raw_parts(ptr, len))
}

/// An extensible argument struct: it begins with `size_t struct_size`; every field
/// may be zero to mean "default".
///
/// # Safety
/// Implementors are `#[repr(C)]` structs of integers, pointers and optional function
/// pointers, for which all-zero bytes are a valid value.
pub(crate) unsafe trait Versioned: Copy {
    const NAME: &'static str;
    /// Bytes through the last required field.
    fn min_size() -> usize;
    /// End offset of every field, in declaration order.
    fn field_ends() -> Vec<usize>;
}

pub(crate) fn size_of_pointee<F>(_: *const F) -> usize {
    std::mem::size_of::<F>()
}

macro_rules! field_end {
    ($t:ty, $f:ident) => {{
        let probe = std::mem::MaybeUninit::<$t>::uninit();
        let base = probe.as_ptr();
        // SAFETY: only the address of the field is taken; nothing is read.
        let field = unsafe { std::ptr::addr_of!((*base).$f) };
        std::mem::offset_of!($t, $f) + crate::handle::size_of_pointee(field)
    }};
}
pub(crate) use field_end;

/// Declares a versioned struct: its required prefix ends with field `$req`.
macro_rules! versioned {
    ($t:ty, required: $req:ident, fields: [$($f:ident),* $(,)?]) => {
        unsafe impl crate::handle::Versioned for $t {
            const NAME: &'static str = stringify!($t);
            fn min_size() -> usize {
                crate::handle::field_end!($t, $req)
            }
            fn field_ends() -> Vec<usize> {
                vec![$(crate::handle::field_end!($t, $f)),*]
            }
        }
    };
}
pub(crate) use versioned;

/// Reads a caller's versioned struct (the one helper every export uses).
///
/// Smaller (older) callers get defaults (zero) for the fields they lack, provided
/// `struct_size` covers every required field and ends on a field boundary. Larger
/// (newer) callers are accepted when every byte this library does not know is zero.
/// Anything else is `invalid_argument`. A NULL pointer gives the all-default value
/// when `optional`.
///
/// # Safety
/// `ptr` is NULL or points to `struct_size` readable bytes.
pub(crate) unsafe fn read_versioned<T: Versioned>(ptr: *const T, optional: bool) -> Result<T> {
    let mut value: T = std::mem::zeroed();
    if ptr.is_null() {
        if optional {
            std::ptr::write(value_struct_size(&mut value), std::mem::size_of::<T>());
            return Ok(value);
        }
        return Err(Error::invalid_argument(format!("{} is NULL", T::NAME)));
    }
    let size = std::ptr::read_unaligned(ptr.cast::<usize>());
    let full = std::mem::size_of::<T>();
    let ends = T::field_ends();
    // Bytes this library knows: through its last field (trailing padding is
    // unknown, so a newer field placed there is not silently ignored).
    let known = ends.last().copied().unwrap_or(full);
    let min = T::min_size();
    if size < min {
        return Err(Error::invalid_argument(format!(
            "{}.struct_size is {size}, smaller than the {min} bytes of its required fields",
            T::NAME
        )));
    }
    if size > known {
        let tail = std::slice::from_raw_parts(ptr.cast::<u8>().add(known), size - known);
        if let Some(at) = tail.iter().position(|b| *b != 0) {
            return Err(Error::invalid_argument(format!(
                "{}.struct_size is {size}, larger than the {known} bytes this library knows, and byte {} of the unknown tail is not zero (a newer field this library cannot honour)",
                T::NAME,
                known + at
            )));
        }
    } else if size < known && !ends.contains(&size) {
        return Err(Error::invalid_argument(format!(
            "{}.struct_size is {size}, which does not end on a field boundary",
            T::NAME
        )));
    }
    std::ptr::copy_nonoverlapping(
        ptr.cast::<u8>(),
        (&mut value as *mut T).cast::<u8>(),
        size.min(known),
    );
    Ok(value)
}

/// The `struct_size` field, always the first.
fn value_struct_size<T>(value: &mut T) -> *mut usize {
    (value as *mut T).cast::<usize>()
}

/// The body of a getter export: checks the handle and writes `f(handle)` to `out`.
///
/// # Safety
/// As [`handle`] and [`put`].
pub(crate) unsafe fn get<T: Tagged, V>(
    ptr: *const T,
    out: *mut V,
    f: impl FnOnce(&T) -> V,
) -> *mut crate::error::colocated_error {
    crate::boundary(|| put(out, f(handle(ptr, T::NAME)?), "out"))
}

/// A getter export returning a string borrowed from the object.
///
/// # Safety
/// As [`handle`] and [`put`].
pub(crate) unsafe fn get_str<T: Tagged>(
    ptr: *const T,
    out: *mut colocated_string_view,
    f: impl for<'a> FnOnce(&'a T) -> &'a CStr,
) -> *mut crate::error::colocated_error {
    crate::boundary(|| {
        put(
            out,
            colocated_string_view::of_cstr(f(handle(ptr, T::NAME)?)),
            "out",
        )
    })
}

/// A getter export returning a borrowed array (of borrowed handles, or of
/// values such as dimensions) and its length.
///
/// # Safety
/// As [`handle`] and [`put`].
pub(crate) unsafe fn get_list<T: Tagged, I>(
    ptr: *const T,
    items: *mut *const I,
    count: *mut usize,
    f: impl for<'a> FnOnce(&'a T) -> &'a [I],
) -> *mut crate::error::colocated_error {
    crate::boundary(|| {
        let list = f(handle(ptr, T::NAME)?);
        put(items, list.as_ptr(), "items")?;
        put(count, list.len(), "count")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_trailing_padding<T: Versioned>() {
        let last = *T::field_ends().last().expect("fields");
        assert_eq!(
            std::mem::size_of::<T>(),
            last,
            "{}: trailing padding would be bytes an older library cannot check",
            T::NAME
        );
    }

    #[test]
    fn versioned_structs_have_no_trailing_padding() {
        no_trailing_padding::<crate::connect::colocated_client_options>();
        no_trailing_padding::<crate::connect::colocated_connect_options>();
        no_trailing_padding::<crate::buffer::colocated_buffer_from_host_args>();
        no_trailing_padding::<crate::array::colocated_named_sharding_args>();
        no_trailing_padding::<crate::array::colocated_array_args>();
        no_trailing_padding::<crate::native::colocated_native_function_args>();
        no_trailing_padding::<crate::host_callback::colocated_host_callback_args>();
        no_trailing_padding::<crate::executable::colocated_array_spec>();
        no_trailing_padding::<crate::executable::colocated_program>();
        no_trailing_padding::<crate::executable::colocated_compile_options>();
        no_trailing_padding::<crate::executable::colocated_execute_options>();
        no_trailing_padding::<crate::colocated::colocated_function_args>();
        no_trailing_padding::<crate::colocated::colocated_function_call_args>();
    }
}
