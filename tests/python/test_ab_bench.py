"""tools/ab-bench run on stand-in benchmark binaries (shell scripts writing JSON): both sides alternate,
--base-env / --head-env reach their side only, and one build serves an environment A/B. No GPU needed."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

# A stand-in for fp4kit-bench-moe: one row whose time is $US (default 10), written where --json says.
FAKE = """#!/usr/bin/env bash
out=""; commit=""
while [ $# -gt 0 ]; do
  case "$1" in --json) out=$2; shift 2 ;; --commit) commit=$2; shift 2 ;; *) shift ;; esac
done
echo "{\\"commit\\": \\"$commit\\", \\"rows\\": [{\\"op\\": \\"fused_moe\\", \\"model\\": \\"m\\", \\"format\\": \\"nvfp4\\", \\"act\\": \\"bf16\\", \\"T\\": 1, \\"us\\": ${US:-10}}]}" > "$out"
"""


def _side(ab, side, commit):
    d = ab / side
    d.mkdir(parents=True)
    b = d / "fp4kit-bench-moe"
    b.write_text(FAKE)
    b.chmod(0o755)
    (d / "COMMIT").write_text(commit + "\n")


def _run(tmp_path, ab, *args):
    env = dict(os.environ, FP4KIT_AB_DIR=str(ab))
    env.pop("OUT", None)
    return subprocess.run(["bash", str(ROOT / "tools" / "ab-bench"), "run", "--out", str(tmp_path / "out"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_environment_ab_with_one_build(tmp_path):
    ab = tmp_path / "ab"
    _side(ab, "head", "abc1234")
    r = _run(tmp_path, ab, "--rounds", "2", "--base-env", "US=10", "--head-env", "US=12", "moe", "--model", "m")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "base environment: US=10" in r.stdout and "head environment: US=12" in r.stdout
    assert "1.200" in r.stdout  # head / base
    for side in ("base", "head"):
        for i in (1, 2):
            d = json.loads((tmp_path / "out" / f"ab_{side}_r{i}.json").read_text())
            assert d["commit"] == "abc1234"
            assert d["rows"][0]["us"] == (10 if side == "base" else 12)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_two_builds_without_environment(tmp_path):
    ab = tmp_path / "ab"
    _side(ab, "base", "aaa0000")
    _side(ab, "head", "bbb1111")
    r = _run(tmp_path, ab, "moe", "--model", "m")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1.000" in r.stdout
    assert json.loads((tmp_path / "out" / "ab_base_r1.json").read_text())["commit"] == "aaa0000"
    assert json.loads((tmp_path / "out" / "ab_head_r2.json").read_text())["commit"] == "bbb1111"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("args, message", [
    (("moe", "--model", "m"), "base/fp4kit-bench-moe is missing"),  # no base build and no environment
    (("--head-env", "NOEQUALS", "moe"), "--head-env takes NAME=VALUE"),
])
def test_bad_runs_say_why(tmp_path, args, message):
    ab = tmp_path / "ab"
    _side(ab, "head", "bbb1111")
    r = _run(tmp_path, ab, *args)
    assert r.returncode == 2
    assert message in r.stdout
