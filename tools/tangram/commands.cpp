// SPDX-License-Identifier: Apache-2.0
#include "commands.hpp"

#include <exception>
#include <iomanip>
#include <ostream>

#include "subcommands.hpp"
#include "tangram/core/detail/str.hpp"
#include "tangram/core/version.hpp"

namespace tangram::cli {

namespace {

using tangram::detail::cat;

struct command {
  char const* name;
  char const* summary;
  command_body (*setup)(CLI::App&);
};

constexpr command commands[] = {
    {"simulate",
     "Replay multi-turn serving: full_kv, unified_nonuniform, tangram (static) and "
     "tangram_elastic (default reservation) side by side",
     setup_simulate},
    {"calibrate",
     "Static budgets from retention samples, with held-out and rank-stability figures",
     setup_calibrate},
    {"plan",
     "A static plan: head groups, page geometry and split map, with waste and imbalance",
     setup_plan},
    {"inspect", "Summary of a static plan, and a picture of its head groups", setup_inspect},
    {"models", "List the built-in model presets", setup_models},
    {"profiles", "List the bundled retention profiles", setup_profiles},
};

void print_help(std::ostream& out) {
  out << "tangram " << version_string
      << ": static per-head KV budgets, head-group paging and AOT decode partitioning\n\n"
         "usage: tangram <command> [options]\n\ncommands:\n";
  for (auto const& c : commands)
    out << "  " << std::left << std::setw(11) << c.name << std::right << c.summary << "\n";
  out << "\nRun `tangram <command> --help` for a command's options. Inputs may be files or the\n"
         "names of bundled profiles (see `tangram profiles`).\n";
}

/// The command's app: CLI11 with the program's conventions (long options only, flags take no
/// value, help as --help or -h).
void configure(CLI::App& app) {
  app.set_help_flag("-h,--help", "Print this help and exit");
  app.option_defaults()->disable_flag_override();
  app.get_formatter()->column_width(34);
}

/// CLI11 reports every argument left over at once; the first, in the program's own words.
std::string extras_message(CLI::App const& app, CLI::ExtrasError const& e) {
  auto left = app.remaining();
  if (left.empty()) return e.what();
  auto const& t = left.front();
  return t.size() > 1 && t[0] == '-' ? cat("unknown option ", tangram::detail::quoted(t))
                                     : cat("unexpected argument ", tangram::detail::quoted(t));
}

/// CLI11's count errors, in the program's words: "--x: given more than once ("4", "8")",
/// "--x: needs a value", "--json: takes no value, got "1"".
std::string mismatch_message(CLI::App const& app,
                             CLI::ArgumentMismatch const& e,
                             std::vector<std::string> const& args) {
  std::string what = e.what();
  if (auto at = what.find(" was given a disallowed flag override"); at != std::string::npos) {
    std::string flag = "--" + what.substr(0, at);
    for (auto const& t : args)
      if (t.rfind(flag + "=", 0) == 0)
        return cat(
            flag, ": takes no value, got ", tangram::detail::quoted(t.substr(flag.size() + 1)));
    return cat(flag, ": takes no value");
  }
  auto name       = what.substr(0, what.find(':'));
  auto const* opt = app.get_option_no_throw(name);
  if (opt == nullptr) return what;
  if (opt->results().size() > 1) {
    std::string given;
    for (auto const& v : opt->results())
      given += (given.empty() ? "" : ", ") + tangram::detail::quoted(v);
    return cat(name, ": given more than once (", given, ")");
  }
  return cat(name, ": needs a value");
}

int fail(streams io, command const& c, std::string_view what, int code) {
  // Messages may carry names from files and the command line: escape_controls keeps them one
  // line and free of terminal control sequences.
  io.err << "tangram " << c.name << ": error: " << tangram::detail::escape_controls(what) << "\n";
  return code;
}

int run_command(command const& c, std::vector<std::string> const& rest, streams io) {
  CLI::App app(c.summary, cat("tangram ", c.name));
  configure(app);
  try {
    command_body body = c.setup(app);
    // Help wins wherever it appears, even after a bad value (CLI11 would report the value first).
    for (auto const& t : rest) {
      if (t == "--help" || t == "-h") {
        io.out << app.help();
        return 0;
      }
    }
    std::vector<std::string> reversed(rest.rbegin(), rest.rend());  // CLI11 takes them reversed
    app.parse(reversed);
    int code = body(io);
    // A full disk or a closed pipe is a failed job, not a silent success.
    if (!io.out.flush()) return fail(io, c, "cannot write the output (standard output failed)", 1);
    return code;
  } catch (CLI::ExtrasError const& e) {
    return fail(io, c, extras_message(app, e), 2);
  } catch (CLI::ArgumentMismatch const& e) {
    return fail(io, c, mismatch_message(app, e, rest), 2);
  } catch (CLI::ParseError const& e) {
    return fail(io, c, e.what(), 2);
  } catch (tangram::invalid_argument const& e) {
    return fail(io, c, e.what(), 2);
  } catch (std::exception const& e) {  // tangram::logic_error and the rest: the job failed
    return fail(io, c, e.what(), 1);
  }
}

}  // namespace

int run(std::vector<std::string> const& argv, streams io) {
  if (argv.size() == 2 && argv[0] == "help") {  // `tangram help plan`: that command's help
    for (auto const& c : commands)
      if (argv[1] == c.name) return run_command(c, {"--help"}, io);
    io.err << "tangram: error: unknown command " << tangram::detail::quoted(argv[1])
           << " (run `tangram help`)\n";
    return 2;
  }
  if (argv.empty() || argv[0] == "help" || argv[0] == "--help" || argv[0] == "-h") {
    print_help(argv.empty() ? io.err : io.out);
    return argv.empty() ? 2 : 0;
  }
  if (argv[0] == "version" || argv[0] == "--version") {
    io.out << "tangram " << version_string << "\n";
    return 0;
  }
  for (auto const& c : commands)
    if (argv[0] == c.name) return run_command(c, {argv.begin() + 1, argv.end()}, io);
  io.err << "tangram: error: unknown command " << tangram::detail::quoted(argv[0])
         << " (run `tangram help`)\n";
  return 2;
}

}  // namespace tangram::cli
