//! The C ABI from C and C++: the example programs' checksum against the Rust API, and the
//! bad-input checks. They are compiled with the system C (or C++) compiler against the committed
//! header and the shared library (built here if needed).

use std::path::{Path, PathBuf};
use std::process::Command;

use insitubatch::{InSituDataset, split_by_chunk};
use insitubatch_tests::{copy_dir, fixture_arrays};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The store of the zarr-python fixture `case` (with `array` in it, when given).
fn fixture_store(case: &str, array: Option<&str>) -> PathBuf {
    fixture_arrays()
        .into_iter()
        .find(|f| f.case == case && array.is_none_or(|a| f.array == a))
        .unwrap_or_else(|| panic!("no fixture {case} {array:?}"))
        .store
}

/// Builds the C library (release) and returns its directory.
fn library_dir() -> PathBuf {
    let out = Command::new(env!("CARGO"))
        .current_dir(root())
        .args(["build", "--release", "-p", "insitubatch-capi"])
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "building the C library failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = root().join("target/release");
    assert!(dir.join("libinsitubatch.so").exists());
    dir
}

/// Compiles a C program (or, for a `.cpp` source, a C++17 one) against the header and the
/// library, warnings as errors.
fn compile(source: &Path, name: &str) -> PathBuf {
    try_compile(source, name, &[]).unwrap_or_else(|e| panic!("{e}"))
}

/// [`compile`] with `flags` added; the compiler's complaint if it fails.
fn try_compile(source: &Path, name: &str, flags: &[&str]) -> Result<PathBuf, String> {
    let lib = library_dir();
    let exe = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let cpp = source.extension().is_some_and(|e| e == "cpp");
    let (var, default) = if cpp { ("CXX", "c++") } else { ("CC", "cc") };
    let cc = std::env::var(var).unwrap_or_else(|_| default.into());
    let out = Command::new(&cc)
        .args(cpp.then_some("-std=c++17"))
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-pthread"])
        .args(flags)
        .arg(source)
        .arg("-I")
        .arg(root().join("bindings/c/include"))
        .arg("-L")
        .arg(&lib)
        .arg("-linsitubatch")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    if !out.status.success() {
        return Err(format!(
            "compiling {} failed:\n{}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}

/// Flags that build a program with AddressSanitizer (leaks included) and UndefinedBehavior-
/// Sanitizer, every finding fatal; `None` when this compiler cannot link such a program.
fn sanitizer_flags() -> Option<&'static [&'static str]> {
    const FLAGS: &[&str] = &[
        "-g",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=undefined",
        "-fno-omit-frame-pointer",
    ];
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe.c");
    std::fs::write(&probe, "int main(void) { return 0; }\n").unwrap();
    let linked = try_compile(&probe, "isb-sanitizer-probe", FLAGS);
    linked.ok().map(|exe| {
        std::fs::remove_file(exe).ok();
        FLAGS
    })
}

/// Runs a sanitized program: a finding exits with 86, not a code the program itself uses.
fn sanitized(exe: &Path) -> Command {
    let mut cmd = c_program(exe);
    cmd.env("ASAN_OPTIONS", "detect_leaks=1:exitcode=86")
        .env("UBSAN_OPTIONS", "print_stacktrace=1");
    cmd
}

/// A command running a compiled C program against the release library it was linked with. The
/// test runner's `LD_LIBRARY_PATH` (searched before the program's run path) may list a directory
/// with another build of `libinsitubatch.so`, so it is set to the release directory.
fn c_program(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.env("LD_LIBRARY_PATH", root().join("target/release"));
    cmd
}

/// Runs a check program, which prints "ok" and exits 0 when every check passed.
fn assert_prints_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "status {:?}\nstdout: {stdout}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the example programs print for `store`, computed through the Rust API: two epochs of
/// train under a 0.75/0.25 split, batches of 8, seed 7.
fn loader_line(store: &Path) -> String {
    let probe = InSituDataset::builder(store).build().unwrap();
    let manifest =
        split_by_chunk(&probe.variables()[0].geom, &[0.75, 0.25], 0, true, None).unwrap();
    let ds = InSituDataset::builder(store)
        .manifest(manifest)
        .batch_size(8)
        .seed(7)
        .build()
        .unwrap();
    let (mut samples, mut index_sum, mut bits) = (0u64, 0u64, 0u64);
    for epoch in 0..2 {
        ds.set_epoch(epoch);
        for b in ds.train().unwrap() {
            let b = b.unwrap();
            samples += b.len() as u64;
            index_sum += b.sample_indices().iter().sum::<u64>();
            for (_, a) in b.arrays() {
                for v in a.values::<f32>().unwrap() {
                    bits = bits.wrapping_add(u64::from(v.to_bits()));
                }
            }
        }
    }
    assert!(samples > 0);
    format!("samples {samples} index_sum {index_sum} checksum {bits}")
}

/// Runs the example `source` on the era5_v3 fixture and checks its line against the Rust API's.
fn example_prints_the_rust_apis_checksum(source: &str, name: &str) {
    let store = fixture_store("era5_v3", None);
    let exe = compile(&root().join(source), name);
    let out = c_program(&exe).arg(&store).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    let expected = loader_line(&store);
    assert_eq!(printed.trim(), expected);
    // A failed call: the program names it, with the library's message, and exits with 1.
    let missing_store = |cmd: &mut Command| {
        let missing = cmd.arg("/nonexistent/store").output().unwrap();
        let stderr = String::from_utf8_lossy(&missing.stderr).into_owned();
        assert_eq!(missing.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("isb_split_by_chunk failed") && stderr.contains("/nonexistent/store"),
            "{stderr}"
        );
    };
    missing_store(&mut c_program(&exe));
    std::fs::remove_file(exe).ok();

    // Both paths again under the sanitizers: nothing leaked (every handle freed, on the early
    // exit too), no invalid access, no undefined behaviour, across the library as well.
    let Some(flags) = sanitizer_flags() else {
        eprintln!("skipped the sanitizer run: this compiler cannot link -fsanitize=address");
        return;
    };
    let exe = try_compile(&root().join(source), &format!("{name}-asan"), flags)
        .unwrap_or_else(|e| panic!("{e}"));
    let out = sanitized(&exe).arg(&store).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), expected);
    missing_store(&mut sanitized(&exe));
    std::fs::remove_file(exe).ok();
}

#[test]
fn the_c_example_prints_the_checksum_the_rust_api_computes() {
    example_prints_the_rust_apis_checksum("examples/c/loader.c", "isb-loader");
}

#[test]
fn the_cpp_example_prints_the_checksum_the_rust_api_computes() {
    example_prints_the_rust_apis_checksum("examples/cpp/loader.cpp", "isb-loader-cpp");
}

#[test]
fn bad_input_through_the_c_abi_is_a_status_and_a_message() {
    let store = fixture_store("era5_v3", None);
    let exe = compile(
        &root().join("bindings/c/tests/abi_checks.c"),
        "isb-abi-checks",
    );
    // A copy of a v3 zstd array with one stored chunk overwritten by garbage.
    let zstd = fixture_store("v3_zstd", None);
    let corrupt = tempfile::tempdir().unwrap();
    copy_dir(&zstd, corrupt.path());
    std::fs::write(corrupt.path().join("c/1/0/0"), b"this is not zstd").unwrap();
    let cache = tempfile::tempdir().unwrap();
    assert_prints_ok(
        c_program(&exe)
            .arg(&store)
            .arg(corrupt.path())
            .arg(cache.path()),
    );
    std::fs::remove_file(exe).ok();
}

#[test]
fn threads_sharing_iterations_and_datasets_through_the_c_abi_get_every_sample_once() {
    let store = fixture_store("paired", Some("raw"));
    let exe = compile(&root().join("bindings/c/tests/threads.c"), "isb-threads");
    let out = c_program(&exe).arg(&store).arg("4").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().last() == Some("ok"),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The C program's reference pass, hashed the same way through the Rust API: per sample, an
    // FNV-1a over each label's row bytes in the batch's label order, summed over the samples.
    let ds = InSituDataset::builder(&store)
        .variable("raw", "raw")
        .variable("mask", "mask")
        .batch_size(3)
        .shuffle(false)
        .build()
        .unwrap();
    let mut total = 0u64;
    for b in ds.all().unwrap() {
        let b = b.unwrap();
        for r in 0..b.len() {
            let mut h = 0xcbf29ce484222325u64;
            for label in b.labels() {
                let a = b.array(label).unwrap();
                let row = a.bytes().len() / b.len();
                for byte in &a.bytes()[r * row..(r + 1) * row] {
                    h = (h ^ u64::from(*byte)).wrapping_mul(0x100000001b3);
                }
            }
            total = total.wrapping_add(h);
        }
    }
    assert_eq!(
        stdout.lines().next(),
        Some(format!("reference {total}").as_str())
    );
    std::fs::remove_file(exe).ok();
}

#[test]
fn chunk_transforms_written_in_c_run_once_per_chunk_and_fail_cleanly() {
    let store = fixture_store("era5_v3", Some("t2m"));
    let exe = compile(
        &root().join("bindings/c/tests/callbacks.c"),
        "isb-callbacks",
    );
    assert_prints_ok(c_program(&exe).arg(&store));
    std::fs::remove_file(exe).ok();
}

#[test]
fn the_cpp_wrapper_delivers_what_the_c_abi_does_and_frees_every_handle() {
    let store = fixture_store("era5_v3", Some("t2m"));
    let source = root().join("bindings/c/tests/wrapper.cpp");
    // The header compiles as pedantic C++17 and C++20.
    let exe = try_compile(&source, "isb-wrapper", &["-pedantic"]).unwrap_or_else(|e| panic!("{e}"));
    assert_prints_ok(c_program(&exe).arg(&store));
    std::fs::remove_file(exe).ok();
    let exe = try_compile(&source, "isb-wrapper-20", &["-pedantic", "-std=c++20"])
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_file(exe).ok();
    // Under the sanitizers: every handle the wrapper owns is freed (tensors kept past their
    // dataset, early exits and failed opens included), and nothing is touched after its free.
    let Some(flags) = sanitizer_flags() else {
        eprintln!("skipped the sanitizer run: this compiler cannot link -fsanitize=address");
        return;
    };
    let exe = try_compile(&source, "isb-wrapper-asan", flags).unwrap_or_else(|e| panic!("{e}"));
    assert_prints_ok(sanitized(&exe).arg(&store));
    std::fs::remove_file(exe).ok();
}

/// The fields of a pkg-config file (`Cflags`, `Libs`, ...) with its variables substituted.
fn pkg_config_fields(pc: &str) -> std::collections::HashMap<String, String> {
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut fields = std::collections::HashMap::new();
    let expand = |value: &str, vars: &[(String, String)]| {
        let mut out = value.trim().to_string();
        for (name, v) in vars.iter().rev() {
            out = out.replace(&format!("${{{name}}}"), v);
        }
        out
    };
    for line in pc.lines() {
        if let Some((name, value)) = line.split_once('=')
            && !name.contains(':')
            && !name.contains(' ')
        {
            let value = expand(value, &vars);
            vars.push((name.to_string(), value));
        } else if let Some((name, value)) = line.split_once(':') {
            fields.insert(name.to_string(), expand(value, &vars));
        }
    }
    fields
}

/// Runs `bindings/c/install.sh` into `prefix`.
fn install_into(prefix: &Path) {
    let out = Command::new(root().join("bindings/c/install.sh"))
        .arg(prefix)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a program built against an installed prefix on `store` as a user would, without
/// `LD_LIBRARY_PATH` (its run path alone must find a shared library): what it printed, and
/// what `ldd` says it loads.
fn run_installed(exe: &Path, store: &Path) -> (String, String) {
    let run = Command::new(exe)
        .arg(store)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}: {}",
        exe.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    let ldd = Command::new("ldd")
        .arg(exe)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&run.stdout).trim().to_string(),
        String::from_utf8_lossy(&ldd.stdout).into_owned(),
    )
}

#[test]
fn an_installed_prefix_builds_c_and_cpp_programs_shared_and_static() {
    let store = fixture_store("era5_v3", None);
    library_dir();
    let prefix = tempfile::tempdir().unwrap();
    install_into(prefix.path());
    let lib = prefix.path().join("lib");
    for installed in [
        "lib/libinsitubatch.so",
        "lib/libinsitubatch.a",
        "include/insitubatch.h",
        "include/insitubatch.hpp",
    ] {
        assert!(prefix.path().join(installed).is_file(), "{installed}");
    }
    let pc = std::fs::read_to_string(lib.join("pkgconfig/insitubatch.pc")).unwrap();
    let fields = pkg_config_fields(&pc);
    let flags = |name: &str| -> Vec<String> {
        fields[name]
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let (cflags, libs, private) = (flags("Cflags"), flags("Libs"), flags("Libs.private"));
    assert_eq!(fields["Version"], env!("CARGO_PKG_VERSION"));
    // pkg-config itself, where installed, reads the file the same way.
    if let Ok(out) = Command::new("pkg-config")
        .args(["--cflags", "--libs", "insitubatch"])
        .env("PKG_CONFIG_PATH", lib.join("pkgconfig"))
        .output()
    {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(got, [cflags.clone(), libs.clone()].concat());
    }

    let expected = loader_line(&store);
    let build_and_run = |source: &str, link: Vec<String>| -> (String, String) {
        let exe = prefix.path().join(Path::new(source).file_stem().unwrap());
        let cpp = source.ends_with(".cpp");
        let out = Command::new(if cpp { "c++" } else { "cc" })
            .args(cpp.then_some("-std=c++17"))
            .args(["-Wall", "-Wextra", "-Werror", "-O1", "-pthread"])
            .arg(root().join(source))
            .args(&cflags)
            .args(&link)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{source}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        run_installed(&exe, &store)
    };
    let rpath = format!("-Wl,-rpath,{}", lib.display());
    for source in ["examples/c/loader.c", "examples/cpp/loader.cpp"] {
        // Shared: `Libs` and a run path into the prefix.
        let (printed, ldd) = build_and_run(source, [libs.clone(), vec![rpath.clone()]].concat());
        assert_eq!(printed, expected, "{source}, shared");
        assert!(
            ldd.contains(&format!("{}/libinsitubatch.so", lib.display())),
            "{source} does not load the installed library:\n{ldd}"
        );
        // Static: the archive and `Libs.private`, nothing else.
        let archive = lib.join("libinsitubatch.a").display().to_string();
        let (printed, ldd) = build_and_run(source, [vec![archive], private.clone()].concat());
        assert_eq!(printed, expected, "{source}, static");
        assert!(!ldd.contains("libinsitubatch"), "{source} static:\n{ldd}");
    }
}

/// The `cmake` of the `cmake` Python package (in `requirements-test.txt`).
fn cmake_program() -> PathBuf {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(&python)
        .args([
            "-c",
            "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))",
        ])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "the CMake test needs the `cmake` Python package (pip install -r requirements-test.txt):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn an_installed_prefix_is_a_cmake_package_that_still_works_when_moved() {
    let store = fixture_store("era5_v3", None);
    library_dir();
    let cmake = cmake_program();
    let dir = tempfile::tempdir().unwrap();
    let installed = dir.path().join("installed");
    install_into(&installed);
    // The package finds its files from its own place: move the prefix before using it.
    let prefix = dir.path().join("moved");
    std::fs::rename(&installed, &prefix).unwrap();

    let project = dir.path().join("project");
    std::fs::create_dir(&project).unwrap();
    let mut lists = String::from(
        "cmake_minimum_required(VERSION 3.16)\nproject(consumer C CXX)\n\
         find_package(insitubatch ${WANT} CONFIG REQUIRED)\n",
    );
    let programs = [
        ("loader_c", "examples/c/loader.c", "insitubatch"),
        ("loader_cpp", "examples/cpp/loader.cpp", "insitubatch"),
        (
            "loader_c_static",
            "examples/c/loader.c",
            "insitubatch_static",
        ),
        (
            "loader_cpp_static",
            "examples/cpp/loader.cpp",
            "insitubatch_static",
        ),
    ];
    for (name, source, target) in programs {
        lists += &format!(
            "add_executable({name} \"{}\")\n\
             set_target_properties({name} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)\n\
             target_link_libraries({name} PRIVATE insitubatch::{target})\n",
            root().join(source).display()
        );
    }
    std::fs::write(project.join("CMakeLists.txt"), lists).unwrap();
    let configure = |want: &str| {
        let build = dir.path().join(format!("build-{want}"));
        let out = Command::new(&cmake)
            .arg("-S")
            .arg(&project)
            .arg("-B")
            .arg(&build)
            .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
            .arg(format!("-DWANT={want}"))
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), build, log)
    };

    // The version file: this major.minor at this or an earlier patch, nothing else (before 1.0
    // a minor release may change the ABI).
    let version = env!("CARGO_PKG_VERSION");
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
    let (major, minor, patch) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    for (want, ok) in [
        (format!("{major}.{minor}"), true),
        (version.to_string(), true),
        (format!("{major}.{minor}.{}", patch + 1), false),
        (format!("{major}.{}", minor + 1), false),
        (format!("{}.0", major + 1), false),
    ] {
        let (configured, _, log) = configure(&want);
        assert_eq!(configured, ok, "find_package(insitubatch {want}):\n{log}");
        if !ok {
            assert!(
                log.contains(version),
                "the refusal names the installed version:\n{log}"
            );
        }
    }

    let (configured, build, log) = configure("");
    assert!(configured, "{log}");
    let out = Command::new(&cmake)
        .arg("--build")
        .arg(&build)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = loader_line(&store);
    let lib = prefix.join("lib").display().to_string();
    for (name, _, target) in programs {
        let exe = build.join(name);
        let (printed, ldd) = run_installed(&exe, &store);
        assert_eq!(printed, expected, "{name}");
        if target == "insitubatch" {
            assert!(
                ldd.contains(&format!("{lib}/libinsitubatch.so")),
                "{name} does not load the installed library:\n{ldd}"
            );
            // Recorded by name, not by path: the prefix can move again under the program.
            let dynamic = Command::new("readelf")
                .arg("-d")
                .arg(&exe)
                .output()
                .unwrap();
            let dynamic = String::from_utf8_lossy(&dynamic.stdout);
            assert!(
                dynamic.contains("Shared library: [libinsitubatch.so]"),
                "{name}:\n{dynamic}"
            );
        } else {
            assert!(!ldd.contains("libinsitubatch"), "{name} is static:\n{ldd}");
        }
    }
}

#[test]
fn the_cpp_snippets_in_the_c_api_docs_compile() {
    // Each ```cpp block of docs/c-api.md becomes the body of a `main` (its includes and
    // namespace aliases at file scope), with the names the prose leaves to the reader: `store`,
    // and `step`, the model's step.
    let doc = std::fs::read_to_string(root().join("docs/c-api.md")).unwrap();
    let blocks: Vec<&str> = doc
        .split("```cpp\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap())
        .collect();
    assert!(blocks.len() >= 2, "docs/c-api.md lost its C++ examples");
    let dir = tempfile::tempdir().unwrap();
    for (i, block) in blocks.iter().enumerate() {
        let (file_scope, body): (Vec<&str>, Vec<&str>) = block
            .lines()
            .partition(|l| l.starts_with("#include") || l.starts_with("namespace "));
        let source = dir.path().join(format!("snippet{i}.cpp"));
        std::fs::write(
            &source,
            format!(
                "#include <string>\n#include \"insitubatch.hpp\"\n{}\nnamespace isb = insitubatch;\n\
                 template <typename... A> void step(A &&...) {{}}\n\
                 int main() {{\n  const std::string store = \"era5.zarr\";\n{}\n}}\n",
                file_scope.join("\n"),
                body.join("\n")
            ),
        )
        .unwrap();
        let exe = try_compile(&source, &format!("isb-doc-snippet{i}"), &["-pedantic"])
            .unwrap_or_else(|e| panic!("docs/c-api.md, C++ example {}:\n{block}\n{e}", i + 1));
        std::fs::remove_file(exe).ok();
    }
}
