//! Logs and traces (placeholder until the Chrome trace writer lands).

/// Installs the log subscriber from the environment, once per process.
pub fn init_from_env() {}
