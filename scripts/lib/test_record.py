#!/usr/bin/env python3
"""The record of test binaries that passed, so that a rerun of the test command skips what
cannot have changed.

A test binary of a crate in SELF_CONTAINED (whose tests read only their crate's folder and
fixtures/, and start no binary of the workspace) passed with some inputs: the binary's own
bytes, those folders' files, the SmolLM2 file, the TESSERA_/RAYON_/RUST_ environment and the
CPU (its kernels follow the CPU's features). When all of them are the same as at a recorded
pass, running its tests again proves nothing new. Every other binary (the router's, the
end-to-end tests', the launcher's and the bench's, which start the binaries or read the
whole tree) always runs, as does everything on a new machine, where there is no record.

    test_record.py skip BINARIES_JSON    prints a nextest filterset that leaves out the binaries
                                         whose record matches (empty: run all), says which on
                                         stderr, and keeps the keys of this run's inputs
    test_record.py save                  records them as passed

BINARIES_JSON is `cargo nextest list --list-type binaries-only --message-format json`.
The record lives in target/test-record/; TESSERA_TEST_ALL=1 ignores it.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
RECORD = ROOT / "target" / "test-record"
SELF_CONTAINED = {
    "tessera-blocks": "blocks",
    "tessera-kernels": "kernels",
    "tessera-model-files": "model-files",
    "tessera-params": "params",
    "tessera-proto": "proto",
    "tessera-shard": "shard",
    "tessera-telemetry": "telemetry",
    "tessera-text": "text",
}


def file_digest(path, h):
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def tree_digest(folder, h):
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d != "target" and not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            h.update(str(path.relative_to(ROOT)).encode() + b"\0")
            file_digest(path, h)


def machine_digest(h):
    for var in sorted(os.environ):
        if var.startswith(("TESSERA_", "RAYON_", "RUST_")):
            h.update(f"{var}={os.environ[var]}\0".encode())
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        lines = cpuinfo.read_text().splitlines()
        h.update("\n".join(sorted({l for l in lines if l.startswith(("model name", "flags"))})).encode())
    h.update(str(sorted(p.name for p in Path("/dev").glob("nvidia*"))).encode())
    cache = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache" / "tessera"))
    model = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if model.exists():
        st = model.stat()
        h.update(f"{model}:{st.st_size}:{st.st_mtime_ns}".encode())


def recordable(binaries_json):
    """(binary id, key) of every self-contained binary."""
    listing = json.loads(Path(binaries_json).read_text())
    shared = hashlib.sha256()
    tree_digest(ROOT / "fixtures", shared)
    machine_digest(shared)
    out = []
    for binary in listing["rust-binaries"].values():
        url, _, fragment = binary["package-id"].rpartition("#")
        package = fragment.split("@")[0] if "@" in fragment else url.rstrip("/").rsplit("/", 1)[-1]
        folder = SELF_CONTAINED.get(package)
        if folder is None:
            continue
        h = shared.copy()
        tree_digest(ROOT / folder, h)
        file_digest(binary["binary-path"], h)
        out.append((binary["binary-id"], h.hexdigest()))
    return out


def record_path(binary_id):
    return RECORD / binary_id.replace("/", "_").replace("::", "__")


PENDING = RECORD / "pending.json"


def skip(binaries_json):
    keys = recordable(binaries_json)
    RECORD.mkdir(parents=True, exist_ok=True)
    PENDING.write_text(json.dumps(keys))
    if os.environ.get("TESSERA_TEST_ALL") == "1":
        return
    unchanged = [
        b for b, key in keys
        if record_path(b).exists() and record_path(b).read_text() == key
    ]
    if unchanged:
        print(
            "test_record: skipping the tests of unchanged binaries, which passed with the same "
            f"bytes and inputs (TESSERA_TEST_ALL=1 runs them): {', '.join(sorted(unchanged))}",
            file=sys.stderr,
        )
        print(" & ".join(f"not binary_id({b})" for b in sorted(unchanged)))


def save():
    for b, key in json.loads(PENDING.read_text()):
        record_path(b).write_text(key)
    PENDING.unlink()


if __name__ == "__main__":
    if sys.argv[1] == "skip":
        skip(sys.argv[2])
    else:
        save()
