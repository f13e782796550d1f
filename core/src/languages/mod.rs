//! The built-in languages the compiler loads programs of, beside the ones an
//! SDK registers: `colocated`, the host side of the colocated protocol
//! (discovery of a function's outputs, the host's parked outputs and its
//! objects), and `xla`, StableHLO programs for a PJRT plugin's devices.

pub(crate) mod colocated;
pub(crate) mod xla;
