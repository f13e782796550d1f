fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A vendored protoc: nothing is downloaded or required on the machine.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    prost_build::Config::new()
        .protoc_executable(&protoc)
        .compile_protos(
            &["proto/executable.proto", "proto/colocated.proto"],
            &["proto"],
        )?;
    let mut remote = prost_build::Config::new();
    // Bulk data as `bytes::Bytes`: decoded without a copy of the payload.
    remote.protoc_executable(&protoc).bytes(["."]);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(remote, &["proto/remote.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/executable.proto");
    println!("cargo:rerun-if-changed=proto/remote.proto");
    println!("cargo:rerun-if-changed=proto/colocated.proto");
    Ok(())
}
