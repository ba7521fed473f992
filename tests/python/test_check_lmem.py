"""tools/check_lmem.py on synthetic ptxas warnings: the largest figures per kernel over architectures, a kernel
over its budget or missing from it fails, one under it passes, --write round-trips, a log without CUDA
compilation passes with a message, and another toolkit release or architecture is not checked. A fake
build directory (CMakeCache.txt and an `nvcc` that prints its release) stands for CMake's. Standard
library only."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TOOL = ROOT / "tools" / "check_lmem.py"

LOG = """[1/3] Building CUDA object CMakeFiles/fp4kit.dir/src/gemm.cu.o
ptxas warning : Registers are spilled to local memory in function '_Z4kernA', 4 bytes spill stores, 8 bytes spill loads
ptxas warning : Local memory used for function '_Z4kernA', size of stack frame: 8 bytes
ptxas warning : Registers are spilled to local memory in function '_Z4kernA', 108 bytes spill stores, 188 bytes spill loads
ptxas warning : Local memory used for function '_Z4kernA', size of stack frame: 72 bytes
ptxas warning : Local memory used for function '_Z4kernB', size of stack frame: 16 bytes
"""


HEADER = "# toolkit: release 13.0; architectures: 90a;80\n"


def write(path, text):
    path.write_text(text)
    return path


def build_dir(tmp_path, release="13.0", archs="90a;80"):
    d = tmp_path / "build"
    d.mkdir(exist_ok=True)
    nvcc = write(d / "nvcc", f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    os.chmod(nvcc, 0o755)
    write(d / "CMakeCache.txt", f"CMAKE_CUDA_COMPILER:FILEPATH={nvcc}\nCMAKE_CUDA_ARCHITECTURES:STRING={archs}\n")
    return d


def run(tmp_path, *args, **facts):
    cmd = [sys.executable, str(TOOL), *map(str, args), "--build-dir", str(build_dir(tmp_path, **facts))]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)


def check(tmp_path, budget_lines, log_text=LOG, **facts):
    """The checker on log_text against a budget of HEADER + budget_lines."""
    log = write(tmp_path / "build.log", log_text)
    budget = write(tmp_path / "budget.txt", HEADER + budget_lines)
    return run(tmp_path, log, "--budget", budget, **facts)


def test_within_budget_passes(tmp_path):
    r = check(tmp_path, "# comment\n72 108 _Z4kernA\n16 0 _Z4kernB\n")
    assert r.returncode == 0, r.stdout
    assert "2 kernels use local memory" in r.stdout


def test_largest_over_architectures_is_checked(tmp_path):
    # kernA's second (sm_80-like) report is the larger: a budget of the first one's figures fails.
    r = check(tmp_path, "8 4 _Z4kernA\n16 0 _Z4kernB\n")
    assert r.returncode == 1
    assert "72 B stack frame, 108 B spill stores: budget 8 B stack, 4 B spill stores" in r.stdout


def test_unlisted_kernel_fails(tmp_path):
    r = check(tmp_path, "72 108 _Z4kernA\n")
    assert r.returncode == 1
    assert "not in the budget (it used none)" in r.stdout
    assert "1 kernel(s) over" in r.stdout


def test_write_round_trips(tmp_path):
    log = write(tmp_path / "build.log", LOG)
    budget = tmp_path / "budget.txt"
    assert run(tmp_path, log, "--write", budget).returncode == 0
    text = budget.read_text()
    assert text.startswith(HEADER)
    lines = [l for l in text.splitlines() if not l.startswith("#")]
    assert lines == ["72 108 _Z4kernA", "16 0 _Z4kernB"]
    assert run(tmp_path, log, "--budget", budget).returncode == 0


def test_malformed_budget_names_the_line(tmp_path):
    r = check(tmp_path, "72 _Z4kernA\n")
    assert r.returncode != 0
    assert "budget.txt:2: expected '<stack bytes> <spill store bytes> <mangled name>'" in r.stderr


def test_no_cuda_compilation_is_not_checked(tmp_path):
    log = write(tmp_path / "build.log", "ninja: no work to do.\n")
    r = run(tmp_path, log, "--budget", tmp_path / "missing.txt")
    assert r.returncode == 0
    assert "nothing to check" in r.stdout


def test_other_toolkit_or_architecture_is_not_checked(tmp_path):
    over = "8 4 _Z4kernA\n"  # over budget if it were checked
    for facts in ({"release": "12.8"}, {"archs": "86"}, {"archs": "90a;100a"}):
        r = check(tmp_path, over, **facts)
        assert r.returncode == 0, facts
        assert "not checked" in r.stdout
    assert check(tmp_path, over, archs="90a").returncode == 1  # a subset of the budget's: checked


def test_anonymous_namespace_hash_is_ignored(tmp_path):
    log = ("[1/1] Building CUDA object x.o\nptxas warning : Local memory used for function "
           "'_ZN6fp4kit38_GLOBAL__N__9fba6e9b_6_moe_cu_4cc7a6da5alignEv', size of stack frame: 8 bytes\n")
    assert check(tmp_path, "8 0 _ZN6fp4kit38_GLOBAL__N__082fcb05_6_moe_cu_4cc7a6da5alignEv\n", log).returncode == 0
    # As --write leaves it (the hash dropped; "6_" after it must not be taken for another hash).
    assert check(tmp_path, "8 0 _ZN6fp4kit38_GLOBAL__N__6_moe_cu_4cc7a6da5alignEv\n", log).returncode == 0
    assert check(tmp_path, "0 0 _ZN6fp4kit38_GLOBAL__N__6_moe_cu_4cc7a6da5alignEv\n", log).returncode == 1


def test_repository_budget_parses():
    budget = ROOT / "tools" / "lmem_budget.txt"
    text = budget.read_text()
    assert text.startswith("# toolkit: release ")
    entries = [l for l in text.splitlines() if l.strip() and not l.startswith("#")]
    assert entries, "tools/lmem_budget.txt lists no kernel"
    for line in entries:
        stack, spill, name = line.split()
        assert stack.isdigit() and spill.isdigit() and name.startswith("_Z")
