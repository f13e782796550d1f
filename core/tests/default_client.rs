//! The process's default client (what `configure`, `devices()` and a connect
//! that becomes the default act on in every SDK). One test: the state is the
//! process's.

mod common;

use colocated_core::{
    configure, current_default_client, default_client, num_cpu_devices_from_env,
    reset_default_client, set_default_client, ClientOptions, ErrorCode, NUM_CPU_DEVICES_ENV,
};
use common::assert_error;

#[test]
fn configured_before_first_use_created_once_replaced_and_reset() {
    // Bad options and a malformed environment are refused.
    assert_error(
        configure(ClientOptions {
            num_cpu_devices: Some(0),
            ..Default::default()
        }),
        ErrorCode::InvalidArgument,
        "num_cpu_devices must be a positive integer",
    );
    // Nothing is created by asking whether there is one.
    assert!(current_default_client().is_none());
    std::env::set_var(NUM_CPU_DEVICES_ENV, "three");
    assert_error(
        num_cpu_devices_from_env(),
        ErrorCode::InvalidArgument,
        "COLOCATED_NUM_CPU_DEVICES must be a positive integer, got 'three'",
    );
    assert_error(default_client(), ErrorCode::InvalidArgument, "three");
    // The environment gives the count unless configure does.
    std::env::set_var(NUM_CPU_DEVICES_ENV, " 5 ");
    assert_eq!(num_cpu_devices_from_env().unwrap(), Some(5));
    configure(ClientOptions {
        num_cpu_devices: Some(3),
        ..Default::default()
    })
    .unwrap();
    let first = default_client().unwrap();
    assert_eq!(first.devices().len(), 3);
    // The same client on every use; too late to configure now.
    assert_eq!(default_client().unwrap().id(), first.id());
    assert_error(
        configure(ClientOptions::default()),
        ErrorCode::FailedPrecondition,
        "already exists with 3 devices",
    );
    // A connect that asks to be the default replaces it.
    let other = colocated_core::Client::new_local(ClientOptions {
        num_cpu_devices: Some(2),
        ..Default::default()
    })
    .unwrap();
    set_default_client(Some(other.clone()));
    assert_eq!(default_client().unwrap().id(), other.id());
    assert_eq!(current_default_client().map(|c| c.id()), Some(other.id()));
    // After a reset (a forked child; the old client is leaked), the next use
    // makes a fresh one from the environment.
    reset_default_client();
    assert!(current_default_client().is_none());
    let fresh = default_client().unwrap();
    assert_ne!(fresh.id(), other.id());
    assert_eq!(fresh.devices().len(), 5);
    // Letting the default go: the next use makes another.
    set_default_client(None);
    assert_ne!(default_client().unwrap().id(), fresh.id());
    std::env::remove_var(NUM_CPU_DEVICES_ENV);
}
