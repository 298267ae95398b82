// SPDX-License-Identifier: Apache-2.0
// tangram_soak: operation storms against kv_cache_manager for as long as asked.
//
// Each storm runs one config of test/support/storm/config.hpp (tiny hybrid plans and real plans
// from the bundled and derived profiles) for --round-ops random steps, checking every invariant
// every --check-every steps against the independent model of test/support/storm/engine_sim.hpp,
// then drains (every live request runs to the end of its turn and is freed; the pool must be
// empty) and destroys the manager (the resource must get its arena back). Storms rotate over the
// configs with seeds derived from --seed until --ops steps or --seconds have passed. Before the
// storms, every config goes through the resource fault cases of test/reliability/faults.hpp.
//
// Exit status: 0 when every check held; 1 on a violation (stderr names the config, the storm
// seed and the op index, and the command that replays it); 2 on a usage error.
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "faults.hpp"
#include "storm/driver.hpp"

namespace {

using tangram::test::storm;
using tangram::test::storm_config;
using tangram::test::storm_totals;

struct options {
  std::int64_t ops         = -1;  ///< total steps; -1: unbounded when seconds is set
  double seconds           = -1;  ///< wall-clock budget; -1: none
  std::uint64_t seed       = 1;
  std::int64_t check_every = 16;
  std::int64_t round_ops   = 20000;
  std::string config;                ///< substring filter on config names
  bool has_storm_seed      = false;  ///< replay: every storm uses exactly this seed
  std::uint64_t storm_seed = 0;
  bool faults              = true;
  bool list                = false;
};

constexpr char const* usage =
    "usage: tangram_soak [--ops N] [--seconds S] [--seed S] [--check-every K] [--round-ops R]\n"
    "                    [--config NAME] [--storm-seed X] [--no-faults] [--list]\n"
    "  --ops N          random steps in all (default 1000000 unless --seconds is given)\n"
    "  --seconds S      stop after S seconds (whichever of --ops / --seconds comes first)\n"
    "  --seed S         master seed (default 1); storm r uses a seed derived from (S, r)\n"
    "  --check-every K  full checks every K steps (default 16; 1 checks after every step);\n"
    "                   every storm is checked in full when it drains\n"
    "  --round-ops R    steps per storm before it drains and a new one starts (default 20000)\n"
    "  --config NAME    only configs whose name contains NAME (--list shows them)\n"
    "  --storm-seed X   replay: use seed X for every storm (printed with a violation)\n"
    "  --no-faults      skip the resource fault-injection cases\n";

[[noreturn]] void usage_error(std::string const& what) {
  std::fprintf(stderr, "tangram_soak: %s\n%s", what.c_str(), usage);
  std::exit(2);
}

std::int64_t to_int(std::string const& flag, char const* v, std::int64_t lo) {
  char* end   = nullptr;
  errno       = 0;
  long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE || x < lo)
    usage_error(flag + ": expected an integer >= " + std::to_string(lo) + ", got \"" + v + "\"");
  return x;
}

std::uint64_t to_uint(std::string const& flag, char const* v) {
  char* end            = nullptr;
  errno                = 0;
  unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE || v[0] == '-')
    usage_error(flag + ": expected an integer in [0, 2^64 - 1], got \"" + v + "\"");
  return x;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value    = [&]() -> char const* {
      if (i + 1 >= argc) usage_error(a + ": missing value");
      return argv[++i];
    };
    if (a == "--ops") {
      o.ops = to_int(a, value(), 0);
    } else if (a == "--seconds") {
      char const* v = value();
      char* end     = nullptr;
      o.seconds     = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(o.seconds > 0) || o.seconds > 1e7)
        usage_error("--seconds: expected a number in (0, 1e7], got \"" + std::string(v) + "\"");
    } else if (a == "--seed") {
      o.seed = to_uint(a, value());
    } else if (a == "--check-every") {
      o.check_every = to_int(a, value(), 1);
    } else if (a == "--round-ops") {
      o.round_ops = to_int(a, value(), 1);
    } else if (a == "--config") {
      o.config = value();
    } else if (a == "--storm-seed") {
      o.has_storm_seed = true;
      o.storm_seed     = to_uint(a, value());
    } else if (a == "--no-faults") {
      o.faults = false;
    } else if (a == "--list") {
      o.list = true;
    } else if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    } else {
      usage_error("unknown option \"" + a + "\"");
    }
  }
  if (o.ops < 0 && o.seconds < 0) o.ops = 1000000;
  return o;
}

/// splitmix64 of (seed, round): independent storm seeds.
std::uint64_t storm_seed(std::uint64_t seed, std::uint64_t round) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + round + 1;
  z               = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z               = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void print_totals(char const* label, storm_totals const& t) {
  std::printf(
      "%-46s ops %10lld  calls %10lld  admitted %8lld (refused %7lld)  chunks %8lld  decode steps "
      "%9lld (tokens %10lld)  turns completed %7lld  continued %7lld (refused %6lld)  forks %7lld "
      "(refused %6lld)  frees %8lld  aborts %7lld  misuses %7lld (bad sizes %6lld)  "
      "unchanged-state checks %7lld  "
      "(page-id arena refusals %5lld)  "
      "full checks %7lld  full-pool bursts %5lld  drains %4lld\n",
      label,
      static_cast<long long>(t.ops),
      static_cast<long long>(t.calls),
      static_cast<long long>(t.admitted),
      static_cast<long long>(t.admit_rejected),
      static_cast<long long>(t.chunks),
      static_cast<long long>(t.decode_steps),
      static_cast<long long>(t.decode_tokens),
      static_cast<long long>(t.completed_turns),
      static_cast<long long>(t.continued),
      static_cast<long long>(t.continue_rejected),
      static_cast<long long>(t.forks),
      static_cast<long long>(t.fork_rejected),
      static_cast<long long>(t.frees),
      static_cast<long long>(t.aborts),
      static_cast<long long>(t.misuses),
      static_cast<long long>(t.bad_sizes),
      static_cast<long long>(t.unchanged_checks),
      static_cast<long long>(t.index_refusals),
      static_cast<long long>(t.full_checks),
      static_cast<long long>(t.full_pool_bursts),
      static_cast<long long>(t.drains));
  std::printf(
      "%-46s extended %8lld (refused %6lld)  speculative steps %8lld  rollbacks %8lld "
      "(tokens %9lld)  parked %7lld (cancelled %6lld)  unparked %7lld (refused %6lld)\n",
      "",
      static_cast<long long>(t.extended),
      static_cast<long long>(t.extend_rejected),
      static_cast<long long>(t.speculative_steps),
      static_cast<long long>(t.rollbacks),
      static_cast<long long>(t.rolled_back),
      static_cast<long long>(t.parks),
      static_cast<long long>(t.park_cancels),
      static_cast<long long>(t.unparks),
      static_cast<long long>(t.unpark_rejected));
  std::printf(
      "%-46s running turns parked %7lld (for a growth %7lld)  resumed %7lld (refused %6lld)\n",
      "",
      static_cast<long long>(t.running_parks),
      static_cast<long long>(t.growth_parks),
      static_cast<long long>(t.resumes),
      static_cast<long long>(t.resume_rejected));
  if (t.elastic_evictions > 0)
    std::printf(
        "%-46s elastic evictions %8lld  wanted tokens clipped %10lld  limit refusals %6lld\n",
        "",
        static_cast<long long>(t.elastic_evictions),
        static_cast<long long>(t.elastic_clipped),
        static_cast<long long>(t.limit_refusals));
}

}  // namespace

int main(int argc, char** argv) {
  options o = parse(argc, argv);
  std::vector<storm_config> configs;
  try {
    for (auto& c : tangram::test::storm_configs())
      if (o.config.empty() || c.name.find(o.config) != std::string::npos)
        configs.push_back(std::move(c));
  } catch (std::exception const& e) {
    std::fprintf(stderr, "tangram_soak: cannot build the plans: %s\n", e.what());
    return 1;
  }
  if (configs.empty()) usage_error("--config: no config name contains \"" + o.config + "\"");
  if (o.list) {
    for (auto const& c : configs)
      std::printf("%-46s groups %4d  pages %7lld  slots %3d  N <= %lld  T <= %lld  %s pool\n",
                  c.name.c_str(),
                  c.plan.num_groups(),
                  static_cast<long long>(c.options.num_pages),
                  c.options.max_sequences,
                  static_cast<long long>(c.max_prompt),
                  static_cast<long long>(c.max_new),
                  c.host ? "host (K/V tags checked)" : "simulated");
    return 0;
  }

  using clock  = std::chrono::steady_clock;
  auto start   = clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - start).count(); };

  std::int64_t fault_cases = 0;
  if (o.faults) {
    for (std::size_t k = 0; k < configs.size(); ++k) {
      auto const& c = configs[k];
      try {
        fault_cases += tangram::test::run_resource_faults(
            c.plan,
            tangram::test::fault_case_pages(c, 4096),
            c.host,
            static_cast<std::uint32_t>(storm_seed(o.seed, 1000000 + k)));
      } catch (std::exception const& e) {
        std::fprintf(stderr,
                     "tangram_soak: VIOLATION in the fault cases of config %s (seed %llu): %s\n",
                     c.name.c_str(),
                     static_cast<unsigned long long>(o.seed),
                     e.what());
        return 1;
      }
    }
  }

  std::vector<storm_totals> per(configs.size());
  std::vector<std::int64_t> storms(configs.size(), 0);
  std::int64_t done = 0;
  bool out_of_time  = false;
  for (std::uint64_t round = 0; !out_of_time && (o.ops < 0 || done < o.ops); ++round) {
    std::size_t k     = static_cast<std::size_t>(round % configs.size());
    auto const& cfg   = configs[k];
    std::uint64_t sd  = o.has_storm_seed ? o.storm_seed : storm_seed(o.seed, round);
    std::int64_t todo = o.round_ops;
    if (o.ops >= 0) todo = std::min(todo, o.ops - done);
    std::int64_t i = 0;
    try {
      storm s(cfg, sd, o.check_every);
      for (; i < todo; ++i) {
        s.step();
        if ((i & 255) == 255 && o.seconds > 0 && elapsed() >= o.seconds) {
          ++i;
          out_of_time = true;
          break;
        }
      }
      s.finish();
      per[k].add(s.totals());
      ++storms[k];
      done += i;
    } catch (std::exception const& e) {
      std::fprintf(stderr,
                   "tangram_soak: VIOLATION in config %s, storm seed %llu, op %lld (checked every "
                   "%lld ops; %s):\n  %s\n  replay: tangram_soak --config %s --storm-seed %llu "
                   "--ops %lld --round-ops %lld --check-every 1 --no-faults\n",
                   cfg.name.c_str(),
                   static_cast<unsigned long long>(sd),
                   static_cast<long long>(i),
                   static_cast<long long>(o.check_every),
                   i == todo ? "while draining" : "during the walk",
                   e.what(),
                   cfg.name.c_str(),
                   static_cast<unsigned long long>(sd),
                   static_cast<long long>(i + 1),
                   static_cast<long long>(i + 1));
      return 1;
    }
  }
  double secs = elapsed();

  storm_totals all;
  std::int64_t all_storms = 0;
  for (std::size_t k = 0; k < configs.size(); ++k) {
    if (storms[k] == 0) continue;
    print_totals(configs[k].name.c_str(), per[k]);
    all.add(per[k]);
    all_storms += storms[k];
  }
  print_totals("all", all);
  std::printf(
      "tangram_soak: OK  %lld ops (%lld manager calls) in %lld storms, %.1f s: %.0f ops/s, %.0f "
      "calls/s; %lld resource fault cases; seed %llu, full checks every %lld ops\n",
      static_cast<long long>(all.ops),
      static_cast<long long>(all.calls),
      static_cast<long long>(all_storms),
      secs,
      secs > 0 ? static_cast<double>(all.ops) / secs : 0.0,
      secs > 0 ? static_cast<double>(all.calls) / secs : 0.0,
      static_cast<long long>(fault_cases),
      static_cast<unsigned long long>(o.seed),
      static_cast<long long>(o.check_every));
  return 0;
}
