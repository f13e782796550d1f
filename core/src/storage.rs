//! Bytes that back a buffer on this host: owned (aligned allocation), borrowed from
//! the caller (zero-copy, released through a callback), or a list of strings.

use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// Alignment of buffers the runtime allocates (a cache line; enough for any dtype).
pub const ALIGNMENT: usize = 64;

enum Owner {
    Allocated(Layout),
    Borrowed(Option<Box<dyn FnOnce() + Send>>),
}

/// Dense bytes. Immutable once shared, except through an external reference whose
/// holder takes responsibility for races (as PJRT's external references do).
pub(crate) struct DenseBytes {
    ptr: NonNull<u8>,
    len: usize,
    owner: Owner,
}

// SAFETY: the bytes are only read after construction (writes go through raw pointers
// handed out explicitly by external references), and the release callback is `Send`.
unsafe impl Send for DenseBytes {}
// SAFETY: see above; shared access is read-only.
unsafe impl Sync for DenseBytes {}

impl DenseBytes {
    /// The number of bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A fresh allocation of `len` bytes; `fill` must write every byte through the
    /// pointer it is given before returning.
    pub fn allocate_with(len: usize, fill: impl FnOnce(*mut u8)) -> Result<DenseBytes> {
        let bytes = DenseBytes::allocate(len, false)?;
        if len > 0 {
            fill(bytes.ptr.as_ptr());
        }
        Ok(bytes)
    }

    /// A fresh allocation of `len` bytes, zero-filled when `zeroed` (else
    /// uninitialised: the caller writes every byte before anyone reads them).
    fn allocate(len: usize, zeroed: bool) -> Result<DenseBytes> {
        if len == 0 {
            return Ok(DenseBytes {
                ptr: NonNull::dangling(),
                len: 0,
                owner: Owner::Borrowed(None),
            });
        }
        let layout = Layout::from_size_align(len, ALIGNMENT).map_err(|_| {
            Error::invalid_argument(format!("a buffer of {len} bytes is too large"))
        })?;
        // SAFETY: layout has a non-zero size.
        let raw = unsafe {
            if zeroed {
                alloc_zeroed(layout)
            } else {
                alloc(layout)
            }
        };
        let ptr = NonNull::new(raw)
            .ok_or_else(|| Error::resource_exhausted(format!("cannot allocate {len} bytes")))?;
        Ok(DenseBytes {
            ptr,
            len,
            owner: Owner::Allocated(layout),
        })
    }

    /// Takes `data` over without copying it.
    pub fn owning(data: Vec<u8>) -> DenseBytes {
        let data = data.into_boxed_slice();
        let (ptr, len) = (data.as_ptr(), data.len());
        // SAFETY: the boxed bytes do not move when the box does, and the box
        // lives until the release callback runs.
        unsafe { DenseBytes::borrowed(ptr, len, Some(Box::new(move || drop(data)))) }
    }

    /// A copy of `src`.
    pub fn copy_of(src: &[u8]) -> Result<DenseBytes> {
        // SAFETY: `dst` is a fresh allocation of `src.len()` bytes.
        DenseBytes::allocate_with(src.len(), |dst| unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
        })
    }

    /// Borrows caller memory (zero-copy). `release` runs once, when the last user
    /// of the bytes is gone.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `len` bytes until `release` runs.
    pub unsafe fn borrowed(
        ptr: *const u8,
        len: usize,
        release: Option<Box<dyn FnOnce() + Send>>,
    ) -> DenseBytes {
        let ptr = NonNull::new(ptr as *mut u8).unwrap_or(NonNull::dangling());
        DenseBytes {
            ptr,
            len,
            owner: Owner::Borrowed(release),
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the lifetime of self (owned, or the
        // borrow contract of `borrowed`); a dangling pointer only with len 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

/// Lets [`bytes::Bytes::from_owner`] send the bytes without a copy.
impl AsRef<[u8]> for DenseBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for DenseBytes {
    fn drop(&mut self) {
        match &mut self.owner {
            // SAFETY: allocated in `allocate_with` with this layout.
            Owner::Allocated(layout) => unsafe { dealloc(self.ptr.as_ptr(), *layout) },
            Owner::Borrowed(release) => {
                if let Some(release) = release.take() {
                    release();
                }
            }
        }
    }
}

/// Zero-filled host memory, aligned to 64 bytes, that its owner writes and then
/// makes a buffer of without a copy (`Buffer::from_host_memory`); for example
/// the output shards that foreign code (a plugin function) fills.
///
/// Owned exclusively until it becomes a buffer, after which it is immutable and
/// freed when the buffer's last user lets go. `Send`: it may be filled on one
/// thread and handed over on another.
pub struct HostMemory(DenseBytes);

impl HostMemory {
    /// `len` zero bytes.
    ///
    /// Errors: `invalid_argument` for a size no allocation can have,
    /// `resource_exhausted` when the allocation fails.
    pub fn zeroed(len: usize) -> Result<HostMemory> {
        DenseBytes::allocate(len, true).map(HostMemory)
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether there are no bytes (nothing is allocated then).
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The bytes, to read.
    pub fn as_slice(&self) -> &[u8] {
        self.0.as_slice()
    }

    /// The bytes, to write; foreign code may write through the slice's pointer
    /// while this value is neither moved into a buffer nor dropped.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the memory is this value's own allocation (or empty), valid for
        // `len` bytes, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.0.ptr.as_ptr(), self.0.len) }
    }

    /// The bytes, to become a buffer's storage.
    pub(crate) fn into_dense(self) -> DenseBytes {
        self.0
    }
}
