fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A vendored protoc: nothing is downloaded or required on the machine.
    prost_build::Config::new()
        .protoc_executable(protoc_bin_vendored::protoc_bin_path()?)
        .compile_protos(&["proto/executable.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/executable.proto");
    Ok(())
}
