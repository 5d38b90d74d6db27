#!/usr/bin/env python3
"""The issue-13 experiment through the binary, one process per run: N damaged copies of two
fixture models (one config.json field set to an edge value, or one tensor's shape or offsets in
model.safetensors' header changed), each run through `foxlm inspect` and a 2-token
`foxlm generate`. Prints how many runs succeeded, failed with a clear error (exit 1, "error: ..."),
or did anything else (a panic or abort), with the first such cases.

Usage: bench/damaged_folders_cli.py [N=3000]   (after cargo build --release -p foxlm)
"""
import collections, json, os, random, shutil, subprocess, sys, tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests/fixtures/official-fox-tiny")
BIN = os.path.join(ROOT, "target/release/foxlm")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
random.seed(13)
VALUES = [0, 1, -1, 2**31, 2**32, 2**63 - 1, 2**64 - 1, 1e300, -1e-300, None, True, "x", [1], {"a": 1},
          7, 3, 4096, 65536, 2**24]
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None
counts = collections.Counter(); bad = []
for i in range(N):
    model = random.choice(["fox_llama", "fox_pro"])
    d = tempfile.mkdtemp(dir=SCRATCH)
    for f in ["config.json", "model.safetensors"]:
        shutil.copy(f"{FIX}/{model}/{f}", d)
    if random.random() < 0.6:
        cfg = json.load(open(f"{d}/config.json"))
        k = random.choice(list(cfg)); v = random.choice(VALUES); cfg[k] = v
        json.dump(cfg, open(f"{d}/config.json", "w")); what = f"{model} config {k}={v}"
    else:
        b = bytearray(open(f"{d}/model.safetensors", "rb").read())
        n = int.from_bytes(b[:8], "little"); h = json.loads(b[8:8+n])
        t = random.choice([k for k in h if k != "__metadata__"])
        if random.random() < 0.5:
            s = h[t]["shape"]; j = random.randrange(len(s)); s[j] = random.choice([0, 1, s[j]*2, 2**31, 2**40])
        else:
            h[t]["data_offsets"][random.randrange(2)] = random.choice([0, 2**40, 2**64-1, h[t]["data_offsets"][0]+4])
        hb = json.dumps(h).encode()
        open(f"{d}/model.safetensors", "wb").write(len(hb).to_bytes(8, "little") + hb + b[8+n:])
        what = f"{model} header {t} {h[t]}"
    for args in (["inspect", "--model", d], ["generate", "--model", d, "--prompt-ids", "0,1", "--max-new-tokens", "2"]):
        r = subprocess.run([BIN] + args, capture_output=True, text=True)
        kind = "ok" if r.returncode == 0 else ("error" if r.returncode == 1 and r.stderr.startswith("error: ") else f"rc{r.returncode}")
        counts[kind] += 1
        if kind not in ("ok", "error"): bad.append((what, args[0], r.returncode, r.stderr[-300:]))
    shutil.rmtree(d)
print(dict(counts)); [print(x) for x in bad[:10]]
