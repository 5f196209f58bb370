//! Builds csrc/longdouble.c: INCRBYFLOAT's long-double arithmetic (src/float.rs).

fn main() {
    println!("cargo:rerun-if-changed=csrc/longdouble.c");
    cc::Build::new()
        .file("csrc/longdouble.c")
        .warnings(true)
        .compile("memkeep_longdouble");
}
