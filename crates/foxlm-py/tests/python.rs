//! The Python package's CPU path under `cargo test`: the extension that cargo built for this test
//! run is put beside a copy of `python/foxlm` as `foxlm/_foxlm.abi3.so` in a temporary folder, and
//! python3 runs `python/tests/test_cpu.py` there (NumPy only: the op against a float64 reference
//! and finite differences, the authors' tiny FoX against their reference logits, loss and greedy
//! tokens, and the errors); and, where python3 has torch, `python/tests/test_torch_cpu.py`. No
//! maturin needed; where python3 has no NumPy, pip installs it into the target folder (PyPI).
//! A machine without python3, or where that install fails, fails this test with the reason: it
//! never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The cdylib of this package in the target folder of the running test binary
/// (target/<profile>/deps/python-<hash> → target/<profile>/deps/libfoxlm_py.so).
fn extension() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("deps folder");
    let profile = deps.parent().expect("profile folder");
    // The one cargo built for this run is in deps/ (the copy beside it in the profile folder is
    // refreshed only by `cargo build`): take the newest.
    let newest = [deps, profile]
        .iter()
        .map(|d| d.join("libfoxlm_py.so"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t);
    if let Some((_, p)) = newest {
        return p;
    }
    panic!(
        "the extension libfoxlm_py.so was not found in {} or {}: cargo builds it with this test \
         (cargo test -p foxlm-py); was the crate-type changed?",
        profile.display(),
        deps.display()
    )
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name.to_string_lossy() == "__pycache__" {
            continue;
        }
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &dst.join(&name));
        } else {
            std::fs::copy(&p, dst.join(&name)).unwrap();
        }
    }
}

#[test]
fn python_package_cpu_path() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = here.parent().and_then(|p| p.parent()).expect("the workspace root");
    let tmp = tempfile::tempdir().unwrap();
    let pkg = tmp.path().join("foxlm");
    copy_dir(&here.join("python/foxlm"), &pkg);
    std::fs::copy(extension(), pkg.join("_foxlm.abi3.so")).unwrap();

    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let pythonpath = with_numpy(&py, tmp.path());
    run_script(&py, &here.join("python/tests/test_cpu.py"), &pythonpath, repo);

    // The torch autograd op on CPU tensors, where this python3 has torch (CI's has not: NumPy
    // covers the kernels there; the GPU check covers the CUDA op).
    let has_torch = Command::new(&py)
        .args(["-c", "import torch"])
        .env("PYTHONPATH", &pythonpath)
        .output()
        .is_ok_and(|o| o.status.success());
    if has_torch {
        run_script(&py, &here.join("python/tests/test_torch_cpu.py"), &pythonpath, repo);
    } else {
        eprintln!("note: `{py}` has no torch: python/tests/test_torch_cpu.py was not run (NumPy tests were)");
    }
}

/// The PYTHONPATH for the scripts: the package's folder, and where `py` has no NumPy of its own,
/// a NumPy that pip installs (from PyPI, once) into the target folder, so that a fresh machine
/// with python3 and pip needs no install step by hand. Fails with the reason when neither works.
fn with_numpy(py: &str, pkg_dir: &Path) -> std::ffi::OsString {
    let probe = |path: &std::ffi::OsStr| Command::new(py).args(["-c", "import numpy"]).env("PYTHONPATH", path).output();
    match probe(pkg_dir.as_os_str()) {
        Err(e) => panic!("`{py}` could not be run ({e}): the Python package's tests need python3 with NumPy"),
        Ok(o) if o.status.success() => return pkg_dir.as_os_str().to_owned(),
        Ok(_) => {}
    }
    let deps = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-deps");
    let path = std::env::join_paths([pkg_dir, deps.as_path()]).expect("a PYTHONPATH of two folders");
    if !probe(&path).is_ok_and(|o| o.status.success()) {
        let out = Command::new(py)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "--target"])
            .arg(&deps)
            .arg("numpy")
            .output()
            .expect("running pip");
        assert!(
            out.status.success(),
            "`{py}` has no NumPy and `{py} -m pip install --target {} numpy` failed: the Python \
             package's tests need NumPy\n{}",
            deps.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let again = probe(&path).expect("running python3");
        assert!(
            again.status.success(),
            "NumPy installed into {} does not import:\n{}",
            deps.display(),
            String::from_utf8_lossy(&again.stderr)
        );
    }
    path
}

/// Runs one of the package's test scripts with `pythonpath` (the package, NumPy); asserts that
/// every test in it ran and passed (its last line is the count).
fn run_script(py: &str, script: &Path, pythonpath: &std::ffi::OsStr, repo: &Path) {
    let out = Command::new(py)
        .arg(script)
        .env("PYTHONPATH", pythonpath)
        .env("FOXLM_REPO", repo)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("running python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{}:\n{stdout}{stderr}", script.display());
    assert!(out.status.success(), "{} failed:\n{stdout}\n{stderr}", script.display());
    let last = stdout.lines().last().unwrap_or("");
    assert!(last.ends_with(" passed, 0 failed") && !last.starts_with("0 "), "unexpected summary: {last}");
}
