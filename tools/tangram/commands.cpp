// SPDX-License-Identifier: Apache-2.0
#include "commands.hpp"

#include <exception>
#include <iomanip>
#include <ostream>

#include "embedded_profiles.hpp"
#include "tangram/detail/json.hpp"
#include "tangram/io/model_spec.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/version.hpp"

namespace tangram::cli {

namespace {

struct command {
  char const* name;
  char const* synopsis;
  int (*fn)(args&, streams);
};

constexpr command commands[] = {
    {"simulate", "simulate [--model M] [--profile P] [--keep K] [--workload short|mid|long|FILE] "
                 "[--sessions N (128)] [--turns N (5)] [--arrival-rate R (0)] [--think S (2)] [--seed N (1)] "
                 "[--gpu-mem GB] [--usable F (0.9)] [--hbm-tbps T (4.8)] [--peak-tflops T (989)] "
                 "[--sms N (132)] [--concurrency N (0)] [--chunk N (8192)] [--step-tokens N (8192)] "
                 "[--max-running N (1024)] [--group-size Hp (4)] [--scope adjacent|layer|global (global)] "
                 "[--page-tokens P (16)] [--plot FILE.svg] [--json] [--quiet]   "
                 "replay multi-turn serving for full_kv / unified_nonuniform / tangram",
     cmd_simulate},
    {"calibrate", "calibrate SAMPLES.json [--estimator musigma|quantile] [--alpha A] [--quantile Q] "
                  "[--floor F] [--folds K] [--group-by-context] [--band W] [--compare] [--out PROFILE.json] "
                  "[--reservation static|elastic [--margin M | --margin-alpha A] [--group-size Hp] [--page-tokens P]] "
                  "[--json]   static budgets from retention samples, with held-out and rank-stability figures",
     cmd_calibrate},
    {"plan", "plan SAMPLES_OR_PROFILE.json [--alpha A | --estimator ...] [--group-size Hp] "
             "[--scope adjacent|layer|global] [--page-tokens P] [--model NAME_OR_FILE] [--sms N --ctas-per-sm C] "
             "[--weighting budget|batch_share] [--reference-contexts N,N,...] [--share-quantile Q] "
             "[--tp-size T --tp-rank R] [--out PLAN.json] [--json]",
     cmd_plan},
    {"inspect", "inspect PLAN.json [--svg FILE.svg] [--json]   summary of a static plan", cmd_inspect},
    {"models", "models [--json]   list the built-in model presets", cmd_models},
    {"profiles", "profiles   list the bundled retention profiles", cmd_profiles},
};

void print_help(std::ostream& out) {
  out << "tangram " << version_string
      << ": static per-head KV budgets, head-group paging and AOT decode partitioning\n\n"
         "usage: tangram <command> [options]\n\ncommands:\n";
  for (auto const& c : commands) out << "  " << c.synopsis << "\n";
  out << "\nRun `tangram <command> --help` for a command's options. Inputs may be files or the\n"
         "names of bundled profiles (see `tangram profiles`).\n";
}

}  // namespace

int cmd_models(args& a, streams io) {
  bool json = a.flag("--json");
  a.finish(0);
  if (json) {
    auto arr = tangram::detail::json::value::array();
    for (auto const& name : model_preset_names())
      arr.push_back(tangram::detail::model_to_json(model_preset(name)));
    auto obj = tangram::detail::json::value::object();
    obj.set("models", std::move(arr));
    io.out << tangram::detail::json::dump(obj, -1) << "\n";
    return 0;
  }
  io.out << std::left << std::setw(16) << "preset" << std::right << std::setw(7) << "layers"
         << std::setw(8) << "q_heads" << std::setw(9) << "kv_heads" << std::setw(9) << "head_dim"
         << std::setw(8) << "GQA" << "  layer kinds\n";
  for (auto const& name : model_preset_names()) {
    auto m = model_preset(name);
    std::string kinds;
    if (auto s = m.count(layer_kind::sliding_window)) {
      std::int32_t w = 0;
      for (auto const& l : m.layers)
        if (l.kind == layer_kind::sliding_window) w = l.window;
      kinds = tangram::detail::cat(m.count(layer_kind::compressed), " full + ", s, " sliding (window ", w, ")");
    } else {
      kinds = tangram::detail::cat(m.num_layers, " full");
    }
    if (m.attention_sinks) kinds += ", attention sinks";
    io.out << std::left << std::setw(16) << name << std::right << std::setw(7) << m.num_layers
           << std::setw(8) << m.num_query_heads << std::setw(9) << m.num_kv_heads << std::setw(9)
           << m.head_dim << std::setw(8) << m.gqa_group() << "  " << kinds << "\n";
  }
  return 0;
}

int cmd_profiles(args& a, streams io) {
  a.finish(0);
  for (auto const& f : embedded_profiles()) {
    std::string_view n = f.name;
    io.out << n.substr(0, n.size() - 5) << "\n";
  }
  return 0;
}

int run(std::vector<std::string> const& argv, streams io) {
  if (argv.empty() || argv[0] == "help" || argv[0] == "--help" || argv[0] == "-h") {
    print_help(argv.empty() ? io.err : io.out);
    return argv.empty() ? 2 : 0;
  }
  if (argv[0] == "version" || argv[0] == "--version") {
    io.out << "tangram " << version_string << "\n";
    return 0;
  }
  for (auto const& c : commands) {
    if (argv[0] != c.name) continue;
    std::vector<std::string> rest(argv.begin() + 1, argv.end());
    for (auto const& t : rest) {
      if (t == "--help" || t == "-h") {
        io.out << "usage: tangram " << c.synopsis << "\n";
        return 0;
      }
    }
    // Messages may carry names from files and the command line: escape_controls keeps them one
    // line and free of terminal control sequences.
    try {
      args a(std::move(rest));
      return c.fn(a, io);
    } catch (tangram::invalid_argument const& e) {
      io.err << "tangram " << c.name << ": error: " << tangram::detail::escape_controls(e.what())
             << "\n";
      return 2;
    } catch (tangram::logic_error const& e) {
      io.err << "tangram " << c.name << ": error: " << tangram::detail::escape_controls(e.what())
             << "\n";
      return 1;
    } catch (std::exception const& e) {
      io.err << "tangram " << c.name << ": error: " << tangram::detail::escape_controls(e.what())
             << "\n";
      return 1;
    }
  }
  io.err << "tangram: error: unknown command " << tangram::detail::quoted(argv[0])
         << " (run `tangram help`)\n";
  return 2;
}

}  // namespace tangram::cli
