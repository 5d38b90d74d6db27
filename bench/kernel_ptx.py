"""Whether a kernel change leaves the generated code alone, without a GPU: compile one NVRTC unit
(the .cu files in the order crates/fox-kernels/src/cuda/compile.rs concatenates them) for sm_90a
at the working tree and at a git revision, and compare the PTX of each kernel entry (line info,
comments, debug strings and branch-label numbers left out). A refactor whose kernels all print
"same" runs the very code that was checked and timed before; "differs" needs the GPU check and
a timing again.

    python3 bench/kernel_ptx.py --base HEAD common.cuh attention.cu wgmma.cu attention_ws.cu

An argument starting with "=" is literal text (with \n for newlines), for the units compile.rs
builds with defines between files, e.g. gla.cu's:

    python3 bench/kernel_ptx.py elem.cuh '=#define ET float\n#define KN(name) name##_f32\n' gla.cu \
        '=#undef ET\n#undef KN\n#define ET u16\n#define KN(name) name##_bf16\n' gla.cu

A few kernels compile to different PTX from the very same text in two compilations (seen on
2026-11-28 with NVRTC 13: ssd_tc_chunk_bwd_*, dr_walk_{fwd,bwd}_k64_f32, fox_fwdwsnp_d128_f16):
where one of those "differs", compare the base with itself before reading anything into it.

Needs NVRTC: the nvidia-cuda-nvrtc wheel (pip install nvidia-cuda-nvrtc) or libnvrtc on the
library path. Exit status 1 when an entry differs.
"""

import argparse
import ctypes
import glob
import os
import re
import site
import subprocess
import sys

KERNELS = "crates/fox-kernels/kernels"


def nvrtc():
    roots = site.getsitepackages() + [site.getusersitepackages()]
    libs = [p for r in roots for p in glob.glob(os.path.join(r, "nvidia", "**", "libnvrtc.so*"), recursive=True)]
    for name in sorted(libs) + ["libnvrtc.so.13", "libnvrtc.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    sys.exit("error: NVRTC not found (pip install nvidia-cuda-nvrtc)")


def ptx(lib, source, arch):
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"unit.cu", 0, None, None) != 0:
        sys.exit("error: nvrtcCreateProgram failed")
    opts = [b"--std=c++17", b"-lineinfo", b"--fmad=true", b"--gpu-architecture=" + arch.encode()]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    if rc != 0:
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(f"error: the unit does not compile:\n{log.value.decode(errors='replace')}")
    n = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, buf)
    return buf.value.decode()


def entries(text):
    """{kernel name: its PTX lines}, without what does not change the code."""
    out, cur = {}, None
    for line in text.split("\n"):
        s = line.strip()
        m = re.search(r"\.entry (\w+)\(", line)
        if m:
            cur = out.setdefault(m.group(1), [])
        if cur is None or not s or s.startswith((".loc", "//", ".b8")) or "$L__info" in s:
            continue
        cur.append(re.sub(r"\$L__BB\d+_\d+", "L", line))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="HEAD", help="the git revision to compare with (default HEAD)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("files", nargs="+", help=f"the unit's files under {KERNELS} in compile.rs's order; =TEXT for literal text")
    a = ap.parse_args()
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip()
    def text(f, rev):
        if f.startswith("="):
            return f[1:].replace("\\n", "\n")
        if rev is None:
            return open(os.path.join(root, KERNELS, f)).read()
        git = ["git", "show", f"{rev}:{KERNELS}/{f}"]
        r = subprocess.run(git, cwd=root, capture_output=True, text=True)
        if r.returncode != 0:
            # a file the revision lacks (added by the change) is empty there; anything else fails
            if "does not exist in" in r.stderr or "exists on disk, but not in" in r.stderr:
                return ""
            sys.exit(f"error: {' '.join(git)}: {r.stderr.strip()}")
        return r.stdout

    now = "".join(text(f, None) for f in a.files)
    then = "".join(text(f, a.base) for f in a.files)
    lib = nvrtc()
    new, old = entries(ptx(lib, now, a.arch)), entries(ptx(lib, then, a.arch))
    differ = 0
    for name in sorted(set(new) | set(old)):
        if name not in old or name not in new:
            state = "new" if name not in old else "removed"
        else:
            state = "same" if new[name] == old[name] else "differs"
        differ += state != "same"
        print(f"{state:8} {name}")
    print(f"{len(set(new) | set(old)) - differ} same, {differ} not, against {a.base}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
