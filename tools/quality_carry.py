#!/usr/bin/env python3
"""Move the quality check's inputs to a GPU machine that has no network, in parts small enough to travel.

Here (where the model file is):
    tools/quality-carry                 # = python3 tools/quality_carry.py split
        splits ~/.cache/fp4kit/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB) into parts of at most 60 MiB under
        .carry/quality/ (git-ignored), copies the text the perplexity is measured on next to them, and writes
        .carry/quality/manifest.json: size and sha256 of the whole file, of every part and of the text.
On the GPU machine, one call per part (tools/gpu-quality PART):
    python3 tools/quality_carry.py stash PART      # check part PART against the manifest, keep it in
                                                   # build/quality-stash/ (survives while the machine is held)
    python3 tools/quality_carry.py assemble        # all parts stashed? join them, check the sha256 of the
                                                   # whole file, print its path (exit 3 while parts are missing)

Standard library only. Every file is checked against the manifest's sha256 before it is used.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".carry" / "quality"
STASH = ROOT / "build" / "quality-stash"
MODEL = Path(os.environ.get("FP4KIT_CACHE") or Path.home() / ".cache" / "fp4kit") / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = Path("/usr/share/common-licenses/GPL-3")
PART_LIMIT = 60 << 20   # below the 64 MiB a call may carry, with room for the manifest and the text
MISSING = 3             # exit status of `assemble` while parts are missing


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def split(model: Path, text: Optional[Path], out: Path, limit: int = PART_LIMIT) -> dict:
    """Write model.partI files of at most `limit` bytes (as few parts as that allows, of near-equal size), a copy
    of `text`, and manifest.json into `out`; returns the manifest."""
    model, out = Path(model), Path(out)
    if not model.is_file():
        raise FileNotFoundError(f"{model}: no such file (run `python -m fp4kit.quality` once to fetch the model)")
    size = model.stat().st_size
    n = max(1, -(-size // limit))
    step = -(-size // n)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model.part*"):
        old.unlink()
    parts = []
    with open(model, "rb") as src:
        for i in range(n):
            data = src.read(step)
            name = f"model.part{i}"
            (out / name).write_bytes(data)
            parts.append({"file": name, "offset": i * step, "bytes": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()})
    man = {"model": {"name": model.name, "bytes": size, "sha256": sha256(model), "parts": parts},
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if text is not None:
        text = Path(text)
        shutil.copyfile(text, out / text.name)
        man["text"] = {"file": text.name, "source": str(text), "bytes": text.stat().st_size,
                       "sha256": sha256(text)}
    (out / "manifest.json").write_text(json.dumps(man, indent=2) + "\n")
    return man


def load_manifest(carry: Path) -> dict:
    path = Path(carry) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (carry .carry/quality/manifest.json with every call)")
    return json.loads(path.read_text())


def _check(path: Path, entry: dict, what: str) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{what}: {path} is missing")
    if path.stat().st_size != entry["bytes"] or sha256(path) != entry["sha256"]:
        raise ValueError(f"{what}: {path} does not match the manifest (size or sha256 differs)")


def stash(part: int, carry: Path = CARRY, stash_dir: Path = STASH) -> Path:
    """Check carried part `part` against the manifest and copy it (and the manifest) into `stash_dir`. A stash
    made from another manifest (another split) is emptied first."""
    man = load_manifest(carry)
    parts = man["model"]["parts"]
    if not 0 <= part < len(parts):
        raise ValueError(f"part: must be in [0, {len(parts)}) for this manifest (got {part})")
    entry = parts[part]
    src = Path(carry) / entry["file"]
    _check(src, entry, f"part {part}")
    stash_dir = Path(stash_dir)
    stash_dir.mkdir(parents=True, exist_ok=True)
    old = stash_dir / "manifest.json"
    if old.is_file() and json.loads(old.read_text())["model"]["sha256"] != man["model"]["sha256"]:
        for f in stash_dir.iterdir():
            f.unlink()
    shutil.copyfile(Path(carry) / "manifest.json", stash_dir / "manifest.json")
    dst = stash_dir / entry["file"]
    shutil.copyfile(src, dst)
    if "text" in man and (Path(carry) / man["text"]["file"]).is_file():
        _check(Path(carry) / man["text"]["file"], man["text"], "text")
        shutil.copyfile(Path(carry) / man["text"]["file"], stash_dir / man["text"]["file"])
    return dst


def missing_parts(stash_dir: Path = STASH) -> List[int]:
    """Indices of the parts not (or not correctly) in the stash; [] when all are there."""
    man = load_manifest(stash_dir)
    out = []
    for i, entry in enumerate(man["model"]["parts"]):
        try:
            _check(Path(stash_dir) / entry["file"], entry, f"part {i}")
        except (FileNotFoundError, ValueError):
            out.append(i)
    return out


def assemble(stash_dir: Path = STASH) -> Path:
    """Join the stashed parts into the model file (in the stash), check its sha256, and return its path."""
    stash_dir = Path(stash_dir)
    man = load_manifest(stash_dir)
    whole = stash_dir / man["model"]["name"]
    if whole.is_file() and whole.stat().st_size == man["model"]["bytes"] and sha256(whole) == man["model"]["sha256"]:
        return whole
    miss = missing_parts(stash_dir)
    if miss:
        raise FileNotFoundError(f"parts {miss} are not in {stash_dir} (each call of tools/gpu-quality stashes one; "
                                "they stay only while the machine is held)")
    tmp = whole.with_suffix(".tmp")
    with open(tmp, "wb") as dst:
        for entry in man["model"]["parts"]:
            with open(stash_dir / entry["file"], "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 22)
    if sha256(tmp) != man["model"]["sha256"]:
        tmp.unlink()
        raise ValueError(f"{whole}: the joined parts do not match the manifest's sha256")
    tmp.replace(whole)
    return whole


def text_path(stash_dir: Path = STASH) -> Optional[Path]:
    """The text to measure on: the system's copy when it is the manifest's text, else the carried copy."""
    man = load_manifest(stash_dir)
    t = man.get("text")
    if t is None:
        return None
    for p in (Path(t["source"]), Path(stash_dir) / t["file"]):
        if p.is_file() and p.stat().st_size == t["bytes"] and sha256(p) == t["sha256"]:
            return p
    raise FileNotFoundError(f"the text {t['source']} is neither on this machine nor carried ({t['file']})")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="split the model into .carry/quality (here)")
    s.add_argument("--model", default=str(MODEL))
    s.add_argument("--text", default=str(TEXT), help="the text to carry along ('' for none)")
    s.add_argument("--out", default=str(CARRY))
    s.add_argument("--limit", type=int, default=PART_LIMIT, help="bytes per part at most")
    s = sub.add_parser("stash", help="keep one carried part in build/quality-stash (GPU machine)")
    s.add_argument("part", type=int)
    s.add_argument("--carry", default=str(CARRY))
    s.add_argument("--stash", default=str(STASH))
    s = sub.add_parser("assemble", help="join the stashed parts; print the model's path (GPU machine)")
    s.add_argument("--stash", default=str(STASH))
    s = sub.add_parser("text", help="print the path of the text to measure on (GPU machine)")
    s.add_argument("--stash", default=str(STASH))
    a = p.parse_args(argv)
    try:
        if a.cmd == "split":
            man = split(Path(a.model), Path(a.text) if a.text else None, Path(a.out), a.limit)
            rel = os.path.relpath(a.out, ROOT)
            print(f"{man['model']['name']}: {man['model']['bytes']} bytes in {len(man['model']['parts'])} parts "
                  f"under {a.out}")
            extra = f" {rel}/{man['text']['file']}" if "text" in man else ""
            for i, part in enumerate(man["model"]["parts"]):
                print(f"  call {i + 1}: tools/gpu-quality {i}   carry: {rel}/manifest.json {rel}/{part['file']}{extra}"
                      f"   ({part['bytes'] / 2**20:.1f} MiB)")
        elif a.cmd == "stash":
            print(stash(a.part, Path(a.carry), Path(a.stash)))
        elif a.cmd == "assemble":
            try:
                print(assemble(Path(a.stash)))
            except FileNotFoundError as e:
                print(f"quality_carry: {e}", file=sys.stderr)
                return MISSING
        elif a.cmd == "text":
            t = text_path(Path(a.stash))
            print(t if t is not None else "")
    except (FileNotFoundError, ValueError) as e:
        print(f"quality_carry: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
