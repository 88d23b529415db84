//! Generates `insitubatch.h` with cbindgen into OUT_DIR; the test `header_is_current` fails when
//! the committed `include/insitubatch.h` differs, and `INSITUBATCH_WRITE_HEADER=1` rewrites it.

fn main() {
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-env-changed=INSITUBATCH_WRITE_HEADER");
    let config = cbindgen::Config::from_file(format!("{crate_dir}/cbindgen.toml"))
        .expect("read cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("generate insitubatch.h");
    bindings.write_to_file(out.join("insitubatch.h"));
    if std::env::var_os("INSITUBATCH_WRITE_HEADER").is_some() {
        bindings.write_to_file(format!("{crate_dir}/include/insitubatch.h"));
    }
}
