//! Generates the CSI services and messages from the CSI spec's `csi.proto`
//! (proto/README.md says where it comes from).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_transport(false)
        .build_server(true)
        // Services not offered yet answer UNIMPLEMENTED, as the spec allows.
        .generate_default_stubs(true)
        .compile_protos(&["proto/csi.proto"], &["proto"])?;
    Ok(())
}
