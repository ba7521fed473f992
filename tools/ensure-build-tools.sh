# Sourced by tools/test, tools/bench and .ci/run: make sure a CMake >= 3.24 and Ninja are on PATH,
# installing them from PyPI (python3 -m pip) when the machine's own are missing or too old.
_fp4kit_cmake_ok() {
  command -v cmake >/dev/null || return 1
  local v major minor
  v=$(cmake --version | sed -n 's/^cmake version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  read -r major minor <<<"$v"
  (( major > 3 || (major == 3 && minor >= 24) ))
}
_fp4kit_ensure_build_tools() {
  local need=()
  _fp4kit_cmake_ok || need+=("cmake>=3.24")
  command -v ninja >/dev/null || need+=(ninja)
  if (( ${#need[@]} )); then
    echo "installing build tools from PyPI: ${need[*]}"
    # Offline, keep going with what is there (CMake says if it is too old; no Ninja means Makefiles).
    "${PYTHON:-python3}" -m pip install -q "${need[@]}" || echo "could not install ${need[*]}; continuing"
  fi
  # Console scripts from pip land in the interpreter's scripts directory: make sure it is on PATH.
  PATH="$("${PYTHON:-python3}" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
  export PATH
}
_fp4kit_ensure_build_tools
