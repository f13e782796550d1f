fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A vendored protoc: nothing is downloaded or required on the machine.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    prost_build::Config::new()
        .protoc_executable(&protoc)
        .compile_protos(&["proto/compile_options.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/compile_options.proto");
    Ok(())
}
