//! `gen-onnx-proto ONNX_PROTO OUT_DIR`: compiles onnx.proto with protox (pure Rust, no protoc)
//! and writes prost's Rust code for package `onnx` into OUT_DIR/onnx.rs.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (proto, out) = (&args[1], &args[2]);
    let dir = std::path::Path::new(proto).parent().unwrap();
    let fds = protox::compile([proto], [dir]).expect("onnx.proto compiles");
    prost_build::Config::new().out_dir(out).compile_fds(fds).expect("prost generates code");
}
