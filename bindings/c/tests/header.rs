//! The committed header is what cbindgen generates from the current sources.

#[test]
fn header_is_current() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/insitubatch.h"));
    let committed = include_str!("../include/insitubatch.h");
    assert!(
        generated == committed,
        "bindings/c/include/insitubatch.h is stale: regenerate it with \
         `INSITUBATCH_WRITE_HEADER=1 cargo build -p insitubatch-capi` and commit it"
    );
}
