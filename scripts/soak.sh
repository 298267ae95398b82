#!/usr/bin/env bash
# Operation storms against kv_cache_manager for a bounded time (docs/reliability.md): builds
# tangram_soak (Release) and runs it. A violation prints the config, storm seed, op index and the
# command that replays it, and fails the script.
#   scripts/soak.sh                          60 s, a new master seed each run (printed)
#   SOAK_SECONDS=3600 scripts/soak.sh        a long local soak
#   SOAK_SEED=7 SOAK_CHECK_EVERY=1 scripts/soak.sh --config tiny    extra options go to tangram_soak
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TANGRAM_SOAK_BUILD_DIR:-${TANGRAM_BUILD_DIR:-build}}
jobs=${TANGRAM_JOBS:-$(nproc)}
seconds=${SOAK_SECONDS:-60}
seed=${SOAK_SEED:-$(date +%s)}
check_every=${SOAK_CHECK_EVERY:-16}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j"$jobs" --target tangram_soak
echo "== tangram_soak: ${seconds}s, seed ${seed}, full checks every ${check_every} ops"
"$build/tools/soak/tangram_soak" --seconds "$seconds" --seed "$seed" --check-every "$check_every" "$@"
