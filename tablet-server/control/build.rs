//! Generates the messages, client and server of `proto/basalt/control/v1/control.proto`.
//!
//! No system `protoc` is needed: `protox` (a protobuf compiler in Rust) parses the file into
//! a `FileDescriptorSet`, and tonic-prost-build generates the code from it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/basalt/control/v1/control.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        // Row keys are `Bytes` everywhere in Basalt (cheap clones, no copies to RowRange).
        .bytes(".basalt.control.v1")
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
