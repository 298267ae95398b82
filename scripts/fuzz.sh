#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang (ASan + UBSan, coverage on all project code) and runs
# each for FUZZ_SECONDS (default 60) from its seed corpus. A crash leaves its input in
# build-fuzz/crashes/<harness>/ and fails the script; turn it into a regression test under
# fuzz/regressions/<harness>/ (replayed by the test suite).
#   scripts/fuzz.sh              all harnesses, 60 s each (CI)
#   FUZZ_SECONDS=3600 scripts/fuzz.sh fuzz_json   one long local soak
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
build=${TANGRAM_FUZZ_BUILD_DIR:-build-fuzz}
jobs=${TANGRAM_JOBS:-$(nproc)}
# libFuzzer needs clang and its compiler-rt runtime; say so plainly instead of a CMake error.
if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found; the libFuzzer harnesses need clang" \
    "(apt-get install clang libclang-rt-dev, or scripts/install_deps.sh fuzz)" >&2
  exit 1
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe/probe.cpp"
if ! clang++ -fsanitize=fuzzer "$probe/probe.cpp" -o "$probe/probe" 2>"$probe/err"; then
  echo "fuzz.sh: clang++ cannot link -fsanitize=fuzzer (libFuzzer runtime missing?):" \
    "$(head -1 "$probe/err") (apt-get install libclang-rt-dev, or scripts/install_deps.sh fuzz)" >&2
  exit 1
fi
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTANGRAM_BUILD_FUZZERS=ON -DTANGRAM_BUILD_TESTS=OFF -DTANGRAM_BUILD_BENCHMARKS=OFF \
  -DTANGRAM_BUILD_EXAMPLES=OFF -DTANGRAM_ENABLE_CUDA=OFF -DTANGRAM_INSTALL=OFF -DTANGRAM_WERROR=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all" >/dev/null
cmake --build "$build" -j"$jobs"
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for f in fuzz/fuzz_*.cpp; do harnesses+=("$(basename "$f" .cpp)"); done
fi
status=0
for h in "${harnesses[@]}"; do
  name=${h#fuzz_}
  work="$build/corpus/$name"
  crashes="$build/crashes/$name"
  mkdir -p "$work" "$crashes"
  seeds=()
  [ -d "fuzz/corpus/$name" ] && seeds+=("fuzz/corpus/$name")
  [ -d "fuzz/regressions/$name" ] && seeds+=("fuzz/regressions/$name")
  echo "== $h: ${seconds}s"
  if ! "$build/fuzz/$h" "$work" "${seeds[@]}" -max_total_time="$seconds" -max_len=65536 \
      -rss_limit_mb=2048 -timeout=10 -artifact_prefix="$crashes/" -print_final_stats=1 2>"$build/$h.log"; then
    echo "!! $h found a failure:"; tail -40 "$build/$h.log"; status=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$build/$h.log" | tail -2 || true
  fi
done
exit $status
