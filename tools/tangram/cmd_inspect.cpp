// SPDX-License-Identifier: Apache-2.0
// `tangram inspect PLAN.json [--svg FILE.svg] [--json]`: a human summary of a static plan and,
// optionally, a picture of its head groups (heads coloured by budget, one column per group).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <memory>
#include <optional>
#include <ostream>

#include "option_values.hpp"
#include "output_path.hpp"
#include "plan_support.hpp"
#include "subcommands.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/plan/clustering.hpp"

namespace tangram::cli {

namespace {

namespace json = tangram::detail::json;
using tangram::detail::cat;
using tangram::detail::printable;

constexpr int histogram_bins = 10;

/// Budget in (0, 1] to a colour from dark blue (small) through yellow to dark red (1).
std::string budget_colour(double b) {
  struct stop {
    double at;
    int r, g, bl;
  };
  constexpr stop stops[] = {{0.0, 49, 54, 149},
                            {0.25, 116, 173, 209},
                            {0.5, 255, 255, 191},
                            {0.75, 244, 109, 67},
                            {1.0, 165, 0, 38}};
  b                      = std::clamp(b, 0.0, 1.0);
  std::size_t i          = 0;
  while (i + 2 < std::size(stops) && b > stops[i + 1].at) ++i;
  double t  = (b - stops[i].at) / (stops[i + 1].at - stops[i].at);
  auto lerp = [&](int x, int y) { return static_cast<int>(std::lround(x + t * (y - x))); };
  char buf[8];
  std::snprintf(buf,
                sizeof(buf),
                "#%02x%02x%02x",
                lerp(stops[i].r, stops[i + 1].r),
                lerp(stops[i].g, stops[i + 1].g),
                lerp(stops[i].bl, stops[i + 1].bl));
  return buf;
}

std::string head_colour(head_rule const& r) {
  if (r.kind == layer_kind::sliding_window) return "#bdbdbd";
  if (r.kind == layer_kind::uncompressed) return "#525252";
  return budget_colour(r.budget);
}

/// One column per group (its Hp member heads stacked, coloured by budget), groups in id order,
/// wrapped into rows; a legend for the colours.
std::string plan_svg(static_plan const& p) {
  constexpr int cell = 12, gap = 3, per_row = 64, margin = 20, header = 46, legend = 40;
  auto G        = p.num_groups();
  int Hp        = p.options.group_size;
  int cols      = std::min<int>(G, per_row);
  int rows      = (G + per_row - 1) / per_row;
  int width     = std::max(2 * margin + cols * (cell + gap), 420);
  int row_h     = Hp * cell + 2 * gap + 8;
  int height    = header + rows * row_h + legend + margin;
  std::string s = cat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"",
                      width,
                      "\" height=\"",
                      height,
                      "\" font-family=\"sans-serif\" font-size=\"11\">\n");
  s += cat("<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  s += cat("<text x=\"",
           margin,
           "\" y=\"18\" font-size=\"14\">",
           xml_escape(p.model.name),
           ": ",
           G,
           " head groups of ",
           Hp,
           " (scope ",
           to_string(p.options.scope),
           ", rank ",
           p.options.tp_rank,
           " of ",
           p.options.tp_size,
           ")</text>\n");
  s += cat("<text x=\"",
           margin,
           "\" y=\"34\">group waste ",
           fixed(100 * group_waste(p.grouping, p.rules), 2),
           "% over the sum of budgets; one column per group, heads coloured by budget</text>\n");
  for (std::int32_t g = 0; g < G; ++g) {
    auto const& grp = p.grouping.groups[static_cast<std::size_t>(g)];
    int x           = margin + (g % per_row) * (cell + gap);
    int y           = header + (g / per_row) * row_h;
    s += cat("<g><title>group ", g, ": ", to_string(grp.rule.kind));
    if (grp.rule.kind == layer_kind::compressed)
      s += cat(", sized by budget ", fixed(grp.rule.budget, 4));
    s += "</title>\n";
    s += cat("<rect x=\"",
             x - 1,
             "\" y=\"",
             y - 1,
             "\" width=\"",
             cell + 2,
             "\" height=\"",
             static_cast<int>(grp.members.size()) * cell + 2,
             "\" fill=\"none\" stroke=\"#222\" stroke-width=\"1\"/>\n");
    for (std::size_t c = 0; c < grp.members.size(); ++c) {
      auto m        = grp.members[c];
      auto const& r = p.rule(m.layer, m.head);
      s += cat("<rect x=\"",
               x,
               "\" y=\"",
               y + static_cast<int>(c) * cell,
               "\" width=\"",
               cell,
               "\" height=\"",
               cell,
               "\" fill=\"",
               head_colour(r),
               "\"><title>layer ",
               p.first_layer + m.layer,
               " head ",
               p.first_kv_head + m.head,
               ": ",
               to_string(r.kind));
      if (r.kind == layer_kind::compressed) s += cat(", budget ", fixed(r.budget, 4));
      s += "</title></rect>\n";
    }
    s += "</g>\n";
  }
  int ly = header + rows * row_h + 10;
  // The legend: a 10 x 10 swatch of `fill` at x, and a label at (x, y).
  auto swatch = [&](int x, std::string const& fill, char const* end) {
    return cat(
        "<rect x=\"", x, "\" y=\"", ly, "\" width=\"10\" height=\"10\" fill=\"", fill, "\"/>", end);
  };
  auto label = [&](int x, int y, char const* text) {
    return cat("<text x=\"", x, "\" y=\"", y, "\">", text, "</text>\n");
  };
  for (int i = 0; i <= 20; ++i) s += swatch(margin + i * 10, budget_colour(i / 20.0), "\n");
  s += label(margin, ly + 24, "budget 0");
  s += label(margin + 170, ly + 24, "1");
  s += swatch(margin + 240, "#bdbdbd", "");
  s += label(margin + 254, ly + 9, "sliding window");
  s += swatch(margin + 350, "#525252", "");
  s += label(margin + 364, ly + 9, "uncompressed");
  s += "</svg>\n";
  return s;
}

struct inspect_args {
  std::optional<std::string> input;
  std::optional<std::string> svg;
  bool json = false;
};

int inspect(inspect_args const& a, streams io) {
  auto const& svg    = a.svg;
  bool const as_json = a.json;
  if (!a.input) throw usage_error("missing PLAN.json (written by `tangram plan --out`)");
  if (svg) check_output_path("--svg", *svg);
  auto in         = read_input(*a.input);
  std::string fmt = format_of(in);
  TANGRAM_EXPECTS(
      fmt == "tangram-static-plan/v1",
      tangram::invalid_argument,
      printable(in.source),
      ": expected a tangram-static-plan/v1 file (from `tangram plan --out`), got format ",
      tangram::detail::quoted(fmt));
  auto p = parse_static_plan(in.text, in.source);
  if (svg) tangram::detail::write_file(*svg, plan_svg(p));

  std::int32_t per_kind[3] = {0, 0, 0};
  for (auto const& g : p.grouping.groups) ++per_kind[static_cast<int>(g.rule.kind)];
  std::vector<std::int64_t> hist(histogram_bins, 0);
  std::int64_t compressed_heads = 0;
  for (auto const& r : p.rules) {
    if (r.kind != layer_kind::compressed) continue;
    ++compressed_heads;
    auto bin =
        std::min(histogram_bins - 1, static_cast<int>(std::floor(r.budget * histogram_bins)));
    ++hist[static_cast<std::size_t>(bin)];
  }
  double waste = group_waste(p.grouping, p.rules);
  auto H       = p.num_kv_heads;
  auto v       = p.splits.view();

  if (as_json) {
    auto o = json::value::object();
    o.set("command", "inspect");
    o.set("input", in.source);
    o.set("model", p.model.name);
    o.set("num_layers", p.num_layers);
    o.set("num_kv_heads", p.num_kv_heads);
    o.set("first_kv_head", p.first_kv_head);
    o.set("tp_size", p.options.tp_size);
    o.set("tp_rank", p.options.tp_rank);
    o.set("first_layer", p.first_layer);
    o.set("last_layer", p.first_layer + p.num_layers);
    o.set("num_groups", p.num_groups());
    auto kinds = json::value::object();
    for (auto k : {layer_kind::compressed, layer_kind::sliding_window, layer_kind::uncompressed})
      kinds.set(std::string(to_string(k)), per_kind[static_cast<int>(k)]);
    o.set("groups_by_kind", std::move(kinds));
    o.set("group_waste", waste);
    o.set("reservation", to_string(p.options.reservation.mode));
    o.set("margin",
          p.options.reservation.mode == reservation_mode::elastic
              ? json::value(p.options.reservation.margin_or_default())
              : json::value(nullptr));
    auto h = json::value::array();
    for (auto c : hist) h.push_back(c);
    o.set("budget_histogram", std::move(h));
    auto shares = json::value::array();
    for (std::int32_t l = 0; l < p.num_layers; ++l) {
      auto row = json::value::array();
      for (std::int32_t k = 0; k < H; ++k) row.push_back(v.share(l, k));
      shares.push_back(std::move(row));
    }
    o.set("split_shares", std::move(shares));
    o.set("svg", svg ? json::value(*svg) : json::value(nullptr));
    io.out << json::dump(o, -1) << "\n";
    return 0;
  }

  auto& s       = io.out;
  auto const& m = p.model;
  s << "plan " << printable(in.source) << "\n"
    << "  model " << printable(m.name) << ": " << m.num_layers << " layers, " << m.num_query_heads
    << " query / " << m.num_kv_heads << " KV heads, head_dim " << m.head_dim << ", "
    << to_string(m.kv_dtype) << "\n"
    << "  tensor parallel: rank " << p.options.tp_rank << " of " << p.options.tp_size
    << ", KV heads " << p.first_kv_head << ".." << p.first_kv_head + H - 1 << "\n"
    << "  pipeline stage: "
    << (p.options.layers ? cat("layers ",
                               p.first_layer,
                               "..",
                               p.first_layer + p.num_layers - 1,
                               " of ",
                               m.num_layers,
                               " (local layer l is model layer ",
                               p.first_layer,
                               " + l)")
                         : cat("none (all ", m.num_layers, " layers)"))
    << "\n"
    << "  profile: scorer " << printable(p.profile.scorer) << ", "
    << to_string(p.profile.calibration.estimator) << ", protected " << p.profile.sink_tokens
    << " + " << p.profile.window_tokens << " tokens\n\n"
    << "  layer kinds:";
  for (auto k : {layer_kind::compressed, layer_kind::sliding_window, layer_kind::uncompressed}) {
    if (m.count(k) == 0) continue;
    s << " " << m.count(k) << " " << to_string(k);
    if (k == layer_kind::sliding_window) {
      std::int32_t w = 0;
      for (auto const& l : m.layers)
        if (l.kind == k) w = l.window;
      s << " (window " << w << ")";
    }
    s << ";";
  }
  s << "\n  layers:      ";
  for (auto const& l : m.layers)
    s << (l.kind == layer_kind::compressed       ? 'C'
          : l.kind == layer_kind::sliding_window ? 'S'
                                                 : 'U');
  s << "   (C compressed, S sliding window, U uncompressed)\n\n"
    << "  page: " << p.options.page_tokens << " tokens x " << p.options.group_size
    << " heads = " << p.page_bytes() << " bytes\n"
    << "  reservation: "
    << (p.options.reservation.mode == reservation_mode::elastic
            ? cat("elastic, margin ", p.options.reservation.margin_or_default())
            : std::string("static"))
    << "\n"
    << "  groups: " << p.num_groups() << ", scope " << to_string(p.options.scope) << ": "
    << per_kind[0] << " compressed, " << per_kind[1] << " sliding_window, " << per_kind[2]
    << " uncompressed\n"
    << "  group waste (compressed heads) over sum of budgets: " << percent(waste, 2) << "\n\n"
    << "  budgets of the " << compressed_heads << " compressed heads:\n";
  std::int64_t peak = std::max<std::int64_t>(1, *std::max_element(hist.begin(), hist.end()));
  for (int b = 0; b < histogram_bins; ++b) {
    s << "    [" << fixed(b / 10.0, 1) << ", " << fixed((b + 1) / 10.0, 1)
      << (b + 1 == histogram_bins ? "]" : ")") << std::setw(6) << hist[static_cast<std::size_t>(b)]
      << "  "
      << std::string(static_cast<std::size_t>(40 * hist[static_cast<std::size_t>(b)] / peak), '#')
      << "\n";
  }
  s << "\n  split map: N_CTA = " << p.splits.num_ctas() << " (" << p.options.split.limits.sm_count
    << " SMs x " << p.options.split.limits.ctas_per_sm << "), weighting "
    << to_string(p.options.split.weighting) << "; CTAs per KV head:\n";
  for (std::int32_t l = 0; l < p.num_layers; ++l) {
    s << "    layer " << std::setw(3) << p.first_layer + l << " " << std::left << std::setw(15)
      << to_string(p.rule(l, 0).kind) << std::right;
    for (std::int32_t k = 0; k < H; ++k)
      s << ' ' << std::setw(4) << v.share(l, k);  // never run together
    s << "\n";
  }
  if (svg) s << "\nwrote " << printable(*svg) << "\n";
  return 0;
}

}  // namespace

command_body setup_inspect(CLI::App& app) {
  auto a = std::make_shared<inspect_args>();
  add_text(app, "PLAN.json", a->input, "", "A static plan, written by `tangram plan --out`");
  add_text(app,
           "--svg",
           a->svg,
           "FILE.svg",
           "Also draw the head groups, coloured by budget, to FILE.svg");
  app.add_flag("--json", a->json, "One JSON document instead of the text summary");
  return [a](streams io) { return inspect(*a, io); };
}

}  // namespace tangram::cli
