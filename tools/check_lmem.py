#!/usr/bin/env python3
"""tools/check_lmem.py: the kernels' local memory (register spills and stack frames) against a budget.

    tools/check_lmem.py BUILD_LOG --build-dir build [--budget tools/lmem_budget.txt]
    tools/check_lmem.py BUILD_LOG --build-dir build --write tools/lmem_budget.txt

ptxas reports, for every kernel it compiles (the project builds with -Xptxas=-warn-spills and
-warn-lmem-usage), the bytes it spills and the stack frame it needs. A kernel that starts spilling, or
spills more, has usually lost registers in its main loop (a runtime index into an accumulator array gave
every grouped prefill kernel a 144-528 byte stack frame; a loop added to the decode kernel's prologue cost
the m = 1 default ~100 bytes of spills); the functional tests pass all the same. This check reads the
warnings of a build log, takes each kernel's largest figures over the architectures it was built for, and
fails where a kernel is over its line in the budget file or is not listed in it. A kernel that spills less
than its budget passes (rewrite the file with --write to lock the gain in).

Budget file: one kernel a line, `<stack frame bytes> <spill store bytes> <mangled name>`; `#` comments.
Only kernels that use local memory are listed: one missing from the build log used none. Names are
compared without the hash of anonymous namespaces (`_GLOBAL__N__<hash>_`), which changes with the path
of the source. Its first line
records the CUDA toolkit release and the architectures it was made with (`# toolkit: release 13.0;
architectures: 90a;80`): register allocation differs between releases and architectures, so a build with
another release, or an architecture outside that list, is not checked (the check says so and passes).
"""
import argparse
import re
import shutil
import subprocess
import sys

SPILL = re.compile(r"Registers are spilled to local memory in function '([^']+)', (\d+) bytes spill stores")
LMEM = re.compile(r"Local memory used for function '([^']+)', size of stack frame: (\d+) bytes")


# Anonymous namespaces: nvcc names them _GLOBAL__N__<8 hex digits>_<length><file>_<hash>; the first hash
# changes with the source's path. Exactly 8 digits, so that a name written without it (the budget's) is
# left as it is.
ANON = re.compile(r"_GLOBAL__N__[0-9a-f]{8}_")


def kernel_name(mangled):
    return ANON.sub("_GLOBAL__N__", mangled)


def read_log(path):
    """{kernel: [stack bytes, spill store bytes]} (maximum over the log's lines) and the CUDA objects built."""
    usage, objects = {}, 0
    with open(path, errors="replace") as f:
        for line in f:
            if "Building CUDA object" in line:
                objects += 1
            for pattern, slot in ((LMEM, 0), (SPILL, 1)):
                m = pattern.search(line)
                if m:
                    u = usage.setdefault(kernel_name(m.group(1)), [0, 0])
                    u[slot] = max(u[slot], int(m.group(2)))
    return usage, objects


def read_budget(path):
    budget = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
                sys.exit(f"check_lmem: {path}:{n}: expected '<stack bytes> <spill store bytes> <mangled name>', got {line!r}")
            budget[kernel_name(parts[2])] = (int(parts[0]), int(parts[1]))
    return budget


HEADER = re.compile(r"#\s*toolkit:\s*(.+?);\s*architectures:\s*(\S+)")


def build_facts(build_dir):
    """(toolkit release, architectures) of a CMake build directory, from its cache and its nvcc."""
    nvcc, archs = "nvcc", ""
    try:
        with open(f"{build_dir}/CMakeCache.txt") as f:
            for line in f:
                if line.startswith("CMAKE_CUDA_COMPILER:"):
                    nvcc = line.split("=", 1)[1].strip()
                elif line.startswith("CMAKE_CUDA_ARCHITECTURES:"):
                    archs = line.split("=", 1)[1].strip()
    except OSError:
        return None, None
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None, archs
    m = re.search(r"release (\d+\.\d+)", out)
    return (f"release {m.group(1)}" if m else None), archs


def budget_facts(path):
    with open(path) as f:
        for line in f:
            m = HEADER.match(line.strip())
            if m:
                return m.group(1), m.group(2)
    return None, None


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="a build log with ptxas's warnings (tools/test keeps one)")
    ap.add_argument("--build-dir", required=True, help="the CMake build directory of the log (toolkit, architectures)")
    ap.add_argument("--budget", default="tools/lmem_budget.txt")
    ap.add_argument("--write", metavar="PATH", help="write the log's figures as the budget instead of checking")
    args = ap.parse_args()

    usage, objects = read_log(args.log)
    toolkit, archs = build_facts(args.build_dir)
    if args.write:
        if not toolkit or not archs:
            sys.exit(f"check_lmem: cannot tell the toolkit release or architectures of {args.build_dir}")
        with open(args.write, "w") as f:
            f.write(f"# toolkit: {toolkit}; architectures: {archs}\n")
            f.write("# Local memory per kernel: stack frame bytes, spill store bytes, mangled name (the largest over\n"
                    "# the architectures built). Checked by tools/check_lmem.py after every tools/test build;\n"
                    "# regenerate with tools/check_lmem.py BUILD_LOG --write tools/lmem_budget.txt.\n")
            for name in sorted(usage):
                f.write(f"{usage[name][0]} {usage[name][1]} {name}\n")
        print(f"check_lmem: wrote {len(usage)} kernels to {args.write}")
        return 0
    if objects == 0:
        print("check_lmem: no CUDA object was compiled in this build (an incremental build): nothing to check")
        return 0

    b_toolkit, b_archs = budget_facts(args.budget)
    if not b_toolkit:
        sys.exit(f"check_lmem: {args.budget} has no '# toolkit: release X.Y; architectures: A;B' line")
    extra = sorted(set(archs.split(";")) - set(b_archs.split(";"))) if archs else ["unknown"]
    if toolkit != b_toolkit or extra:
        print(f"check_lmem: not checked: {args.budget} was made with {b_toolkit} for {b_archs}; this build uses "
              f"{toolkit or 'an unknown toolkit'} for {archs or 'unknown architectures'}")
        return 0
    budget = read_budget(args.budget)
    over = [(n, u, budget.get(n)) for n, u in sorted(usage.items())
            if n not in budget or u[0] > budget[n][0] or u[1] > budget[n][1]]
    if not over:
        print(f"check_lmem: {len(usage)} kernels use local memory, each within {args.budget} "
              f"({objects} CUDA objects compiled)")
        return 0
    names = demangle([n for n, _, _ in over])
    for n, u, b in over:
        rule = "not in the budget (it used none)" if b is None else f"budget {b[0]} B stack, {b[1]} B spill stores"
        print(f"check_lmem: {names[n]}\n    {u[0]} B stack frame, {u[1]} B spill stores: {rule}")
    print(f"check_lmem: {len(over)} kernel(s) over their local-memory budget ({args.budget}). A new spill usually"
          " means registers lost in a main loop: look at the change, or, if it is measured harmless, rewrite"
          " the budget with --write.")
    return 1


if __name__ == "__main__":
    sys.exit(main())
