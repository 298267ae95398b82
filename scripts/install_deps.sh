#!/usr/bin/env bash
# Installs, with apt-get, what scripts/run_tests.sh needs and the machine lacks (Debian/Ubuntu).
# Idempotent and non-interactive: when everything is present it does nothing and exits 0.
#   scripts/install_deps.sh                  everything every stage needs
#   scripts/install_deps.sh main asan        only what those run_tests.sh stages need
# Runs `apt-get update` only when the package lists are empty or an install fails. Needs root to
# install; otherwise it prints the apt-get command to run and exits 1. ccache (rebuilds reuse
# objects) and ninja (per-step times in .ninja_log) are installed for the main stage; the scripts
# use them whenever they are present.
set -euo pipefail

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(main python asan tsan soak valgrind emu fuzz)

# has_header <relative path>: the header is in a default include directory.
has_header() { [ -f "/usr/include/$1" ] || [ -f "/usr/local/include/$1" ]; }
# libFuzzer's runtime (clang -fsanitize=fuzzer) comes with compiler-rt; both directory layouts
# (lib/linux/*-<arch>.a and lib/<triple>/*.a) exist across LLVM versions.
has_libfuzzer() {
  compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a" >/dev/null ||
    compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/*/libclang_rt.fuzzer.a" >/dev/null
}

missing=()
need() { [[ " ${missing[*]} " == *" $1 "* ]] || missing+=("$1"); }
for s in "${stages[@]}"; do
  case $s in
    main | python | hf | asan | tsan | soak | valgrind | emu | fuzz) ;;
    *) echo "install_deps.sh: unknown stage '$s' (main, python, hf, asan, tsan, soak, valgrind, emu, fuzz)" >&2; exit 2 ;;
  esac
  command -v cmake >/dev/null || need cmake
  command -v g++ >/dev/null || need g++
  case $s in
    main)
      command -v ccache >/dev/null || need ccache
      command -v ninja >/dev/null || need ninja-build
      has_header catch2/catch.hpp || need catch2
      has_header benchmark/benchmark.h || need libbenchmark-dev
      ;;
    python | hf)
      # The package builds from PyPI's nanobind and scikit-build-core inside a virtual environment.
      command -v python3 >/dev/null || need python3
      python3 -c 'import venv, ensurepip' 2>/dev/null || need python3-venv
      python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null || need python3-dev
      ;;
    tsan) has_header catch2/catch.hpp || need catch2 ;;
    asan | emu) # clang builds the instrumented suites (emu: the emulation suite under ASan)
      has_header catch2/catch.hpp || need catch2
      command -v clang++ >/dev/null || need clang
      ;;
    valgrind)
      has_header catch2/catch.hpp || need catch2
      command -v valgrind >/dev/null || need valgrind
      ;;
    fuzz)
      command -v clang++ >/dev/null || need clang
      has_libfuzzer || need libclang-rt-dev
      ;;
  esac
done

# The SASS tools of the static roofline check (ctest kernels:roofline) where nvcc builds the
# kernels: cuobjdump and nvdisasm from their Python wheels when the toolkit lacks them.
if [[ " ${stages[*]} " == *" main "* ]] && command -v nvcc >/dev/null; then
  "$(dirname "$0")/install_sass_tools.sh"
fi

[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null; then
  echo "install_deps.sh: missing ${missing[*]} (Debian package names) and no apt-get here;" \
    "install them with this system's package manager" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_deps.sh: missing ${missing[*]}; installing needs root. Run:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "install_deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null; then
  apt-get update
fi
apt-get install -y --no-install-recommends "${missing[@]}" ||
  { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; }
