//! Compiles the proto with a pure-Rust compiler, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=v1/generate.proto");
    let descriptors = protox::compile(["v1/generate.proto"], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
