// SPDX-License-Identifier: Apache-2.0
// `tangram calibrate`, `tangram plan` and `tangram inspect`, driven in-process.
#include <algorithm>
#include <filesystem>
#include <sstream>

#include "cli_support.hpp"
#include "commands.hpp"
#include "tangram/eval/split_imbalance.hpp"
#include "tangram/io/budget_profile.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"
#include "tangram/io/retention_samples.hpp"
#include "tangram/io/static_plan.hpp"
#include "tangram/model/presets.hpp"
#include "tangram/plan/build_static_plan.hpp"
#include "tangram/plan/calibration.hpp"
#include "test_support.hpp"

using namespace tangram;
using tangram::test::data_path;
namespace json = tangram::detail::json;

using tangram::test::run;

namespace {

using result = tangram::test::cli_result;

std::string tmp(std::string const& name) {
  return tangram::test::cli_tmp_path("cli_plan", name);
}

json::value parse_out(result const& r) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  REQUIRE(r.out.find('\n') == r.out.size() - 1);  // one line
  return json::parse(r.out, "stdout");
}

double num(json::value const& v, char const* key) {
  auto const* m = v.find(key);
  REQUIRE(m != nullptr);
  REQUIRE(m->type() == json::kind::number);
  return m->number();
}

void expect_error(std::vector<std::string> const& argv, int code, std::vector<std::string> const& pieces) {
  tangram::test::check_refused(argv, pieces, code, true);
}

}  // namespace

TEST_CASE("calibrate --json reports the library's figures", "[cli]") {
  auto v = parse_out(
      run({"calibrate", "keydiff/llama-3.1-8b-instruct", "--reservation", "static", "--json"}));
  CHECK(num(v, "reserved_over_ideal") == Approx(1.303).margin(5e-4));
  CHECK(100 * num(v, "heldout_clip_fraction") == Approx(0.163).margin(5e-4));
  auto s   = load_retention_samples(data_path("profiles/keydiff/llama-3.1-8b-instruct.json"));
  auto rep = evaluate_calibration(s);
  CHECK(num(v, "reserved_over_ideal") == rep.reserved_over_ideal);
  CHECK(num(v, "heldout_clip_fraction") == rep.heldout_clip_fraction);
  CHECK(num(v, "rank_spearman_mean") == rep.rank_spearman_mean);
  CHECK(num(v, "rank_spearman_min") == rep.rank_spearman_min);
  CHECK(num(v, "narrow_band_share") == rep.narrow_band_share);
  CHECK(num(v, "num_samples") == 28);
  CHECK(v.find("estimator")->string() == "musigma");
  CHECK(v.find("out")->is_null());

  // Another estimator, another fold count.
  auto q  = parse_out(run({"calibrate",
                           data_path("profiles/snapkv/qwen3-4b-instruct-2507.json"),
                           "--estimator",
                           "quantile",
                           "--quantile=0.9",
                           "--folds",
                           "4",
                           "--reservation",
                           "static",
                           "--json",
                           "--compare"}));
  auto sq = load_retention_samples(data_path("profiles/snapkv/qwen3-4b-instruct-2507.json"));
  auto rq = evaluate_calibration(sq, {budget_estimator::quantile, 2, 0.9, 0.01}, {4, 0.05});
  CHECK(num(q, "heldout_clip_fraction") == rq.heldout_clip_fraction);
  CHECK(q.find("fold_clip_fractions")->elements().size() == 4);
  CHECK(q.find("comparison")->elements().size() == 12);
  auto gc = parse_out(run({"calibrate",
                           "ea/qwen3-4b-instruct-2507",
                           "--group-by-context",
                           "--reservation",
                           "static",
                           "--json"}));
  CHECK(gc.find("group_by_context")->boolean());
  CHECK(num(gc, "heldout_clip_fraction") ==
        evaluate_calibration(
            load_retention_samples(data_path("profiles/ea/qwen3-4b-instruct-2507.json")),
            {},
            {2, 0.05, true})
            .heldout_clip_fraction);
  // --folds 0 skips the held-out figures (null, not NaN: the output stays valid JSON).
  auto z = parse_out(run({"calibrate",
                          "ea/qwen3-4b-instruct-2507",
                          "--folds",
                          "0",
                          "--reservation",
                          "static",
                          "--json"}));
  CHECK(z.find("heldout_clip_fraction")->is_null());
}

TEST_CASE("calibrate writes a profile and a readable table", "[cli]") {
  auto path = tmp("snapkv-llama.profile.json");
  auto r    = run({"calibrate",
                   "snapkv/llama-3.1-8b-instruct",
                   "--reservation",
                   "static",
                   "--out",
                   path,
                   "--compare"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  for (char const* piece : {"reserved / mean dynamic",
                            "1.249",
                            "clipped tokens, held out",
                            "0.293%",
                            "Spearman",
                            "estimator comparison",
                            "quantile",
                            "wrote "})
    CHECK(r.out.find(piece) != std::string::npos);
  auto p = load_budget_profile(path);
  auto s = load_retention_samples(data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  CHECK(p.budgets == calibrate(s).budgets);
  CHECK(p.sink_tokens == 32);
  CHECK(p.window_tokens == 4096);
  // The default (elastic) report writes the same profile, shaped by the estimator options.
  auto elastic = tmp("snapkv-llama.elastic.profile.json");
  auto e = run({"calibrate", "snapkv/llama-3.1-8b-instruct", "--alpha", "1", "--out", elastic});
  INFO(e.err);
  REQUIRE(e.code == 0);
  CHECK(e.out.find("(elastic reservation)") != std::string::npos);
  CHECK(e.out.find("wrote ") != std::string::npos);
  calibration_options alpha1;
  alpha1.alpha = 1;
  CHECK(load_budget_profile(elastic).budgets == calibrate(s, alpha1).budgets);
}

TEST_CASE("calibrate: bad options and inputs are one-line errors with exit 2", "[cli][errors]") {
  expect_error({"calibrate"}, 2, {"tangram calibrate: error: missing SAMPLES.json"});
  expect_error(
      {"calibrate", "snapkv/llama-3.1-8b-instruct", "--estimator", "quantile", "--alpha", "2"},
      2,
      {"--alpha: applies to --estimator musigma only"});
  expect_error(
      {"calibrate", "snapkv/llama-3.1-8b-instruct", "--quantile", "0.9"}, 2, {"--quantile"});
  expect_error({"calibrate", "snapkv/llama-3.1-8b-instruct", "--estimator", "median"},
               2,
               {"--estimator", "\"median\""});
  expect_error({"calibrate", "snapkv/llama-3.1-8b-instruct", "--alpha", "-1"},
               2,
               {"--alpha: must be in [0, 1000], got -1"});
  expect_error({"calibrate", "snapkv/llama-3.1-8b-instruct", "--floor", "0"},
               2,
               {"--floor: must be in (0, 1], got 0"});
  expect_error(
      {"calibrate", "snapkv/llama-3.1-8b-instruct", "--folds", "1"}, 2, {"--folds", "got 1"});
  expect_error({"calibrate", "snapkv/llama-3.1-8b-instruct", "--folds", "29"},
               2,
               {"--folds: 29 folds need at least 29 samples", "has 28"});
  expect_error(
      {"calibrate", "snapkv/llama-3.1-8b-instruct", "--bogus"}, 2, {"unknown option \"--bogus\""});
  expect_error(
      {"calibrate", "no/such-profile"}, 2, {"no such file or bundled profile", "no/such-profile"});
  auto profile = tmp("for-calibrate.profile.json");
  REQUIRE(run({"calibrate", "ea/llama-3.1-8b-instruct", "--out", profile}).code == 0);
  expect_error({"calibrate", profile},
               2,
               {"expected a retention-samples/v1 file", "tangram-budget-profile/v1"});
  auto broken = tmp("broken.samples.json");
  detail::write_file(broken, R"({"format": "retention-samples/v1", "model": "m", "scorer": "s",
    "target_keep_ratio": 0.3, "sink_tokens": 1, "window_tokens": 1, "num_model_layers": 2,
    "layer_ids": [0, 1], "num_kv_heads": 1, "samples": [{"context_tokens": 10, "kept_tokens": [[3], [11]]}]})");
  expect_error({"calibrate", broken, "--folds", "0"},
               2,
               {"samples[0].kept_tokens[1][0]", "must not exceed"});
}

TEST_CASE("plan --json: group waste, groups and split imbalance of the plan", "[cli]") {
  // Static: the split imbalance below is the budgets' (an elastic plan's is its placements').
  // Groups of 4: the default per-head pages (Hp 1) waste nothing under any scope.
  auto v = parse_out(run({"plan",
                          "snapkv/llama-3.1-8b-instruct",
                          "--json",
                          "--reservation",
                          "static",
                          "--group-size",
                          "4"}));
  auto s = load_retention_samples(data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
  plan_options so;
  so.group_size       = 4;
  so.reservation.mode = reservation_mode::static_budgets;
  auto plan           = build_static_plan(model_preset("llama-3.1-8b"), calibrate(s), so);
  CHECK(num(v, "num_groups") == 64);
  CHECK(num(v, "group_waste") == group_waste(plan.grouping, plan.rules));
  CHECK(v.find("model")->string() == "Llama-3.1-8B");
  CHECK(num(v, "num_ctas") == 264);
  auto imb = layer_imbalance(plan.rules, plan.splits, log_uniform_contexts(32, 1024, 131072, 1));
  CHECK(num(v, "split_imbalance") == imb.aot.mean);
  CHECK(num(v, "equal_split_imbalance") == imb.equal_split.mean);
  CHECK(num(v, "greedy_imbalance") == imb.greedy.mean);
  auto const* by_scope = v.find("group_waste_by_scope");
  REQUIRE(by_scope != nullptr);
  double adj = by_scope->find("adjacent")->number(), lay = by_scope->find("layer")->number(),
         glob = by_scope->find("global")->number();
  CHECK(glob == num(v, "group_waste"));
  CHECK(glob < lay);
  CHECK(lay < adj);
  // The default: per-head pages, one group per head and no group waste.
  auto one = parse_out(run({"plan", "snapkv/llama-3.1-8b-instruct", "--json"}));
  CHECK(num(one, "num_groups") == 256);
  CHECK(num(one, "group_waste") == 0);
  CHECK(num(one, "page_bytes") == 1 * 2 * 16 * 128 * 2);

  // Options reach the plan.
  auto w = parse_out(run({"plan",
                          "snapkv/llama-3.1-8b-instruct",
                          "--json",
                          "--group-size",
                          "2",
                          "--scope",
                          "layer",
                          "--page-tokens",
                          "32",
                          "--sms",
                          "100",
                          "--ctas-per-sm",
                          "3",
                          "--weighting",
                          "budget",
                          "--alpha",
                          "1.5"}));
  CHECK(num(w, "num_groups") == 128);
  CHECK(w.find("scope")->string() == "layer");
  CHECK(num(w, "page_bytes") == 2 * 2 * 32 * 128 * 2);
  CHECK(num(w, "num_ctas") == 300);
  CHECK(w.find("split_weighting")->string() == "budget");
  auto p15 = build_static_plan(
      model_preset("llama-3.1-8b"),
      calibrate(s, {budget_estimator::musigma, 1.5, 0.95, 0.01}),
      {2, grouping_scope::layer, 32, {{100, 3}, split_weighting::budget}, 1, 0, {}, std::nullopt});
  CHECK(num(w, "group_waste") == group_waste(p15.grouping, p15.rules));
}

TEST_CASE("plan --out / inspect: files, tensor parallel ranks, hybrid models, SVG", "[cli]") {
  auto path = tmp("llama.rank1.plan.json");
  auto r    = run({"plan",
                   "fastkvzip/llama-3.1-8b-instruct",
                   "--tp-size",
                   "2",
                   "--tp-rank",
                   "1",
                   "--out",
                   path});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("rank 1 of 2: heads 4..7") != std::string::npos);
  CHECK(r.out.find("AOT split map") != std::string::npos);
  auto p = load_static_plan(path);
  CHECK(p.options.tp_size == 2);
  CHECK(p.first_kv_head == 4);
  CHECK(p.num_groups() == 128);  // per-head pages (the default): 32 layers x 4 heads

  // The reference traffic of the split map: a service of long prompts only (a static plan, whose
  // map is weighed on its budgets).
  auto long_path = tmp("llama.long-traffic.plan.json");
  auto lr        = run({"plan",
                        "snapkv/llama-3.1-8b-instruct",
                        "--reservation",
                        "static",
                        "--reference-contexts",
                        "65536,131072",
                        "--share-quantile",
                        "0.5",
                        "--out",
                        long_path});
  INFO(lr.err);
  REQUIRE(lr.code == 0);
  auto lp = load_static_plan(long_path);
  CHECK(lp.options.split.reference_contexts == std::vector<std::int64_t>{65536, 131072});
  CHECK(lp.options.split.share_quantile == 0.5);
  split_options want;
  want.limits             = lp.options.split.limits;
  want.reference_contexts = {65536, 131072};
  want.share_quantile     = 0.5;
  CHECK(build_split_map(lp.rules, lp.num_layers, lp.num_kv_heads, want).cta_begin ==
        lp.splits.cta_begin);

  auto svg = tmp("llama.rank1.svg");
  auto i   = run({"inspect", path, "--svg", svg});
  INFO(i.err);
  REQUIRE(i.code == 0);
  for (char const* piece : {"Llama-3.1-8B",
                            "rank 1 of 2, KV heads 4..7",
                            "groups: 128, scope global",
                            "group waste",
                            "[0.2, 0.3)",
                            "CTAs per KV head",
                            "layer  31 compressed"})
    CHECK(i.out.find(piece) != std::string::npos);
  auto picture = detail::read_file(svg);
  CHECK(picture.rfind("<svg", 0) == 0);
  CHECK(picture.find("</svg>") != std::string::npos);
  std::size_t heads = 0;
  for (auto pos = picture.find("<title>layer "); pos != std::string::npos;
       pos      = picture.find("<title>layer ", pos + 1))
    ++heads;
  CHECK(heads == 32 * 4);
  CHECK(picture.find("layer 0 head 4:") != std::string::npos);  // model head numbers

  auto j      = parse_out(run({"inspect", path, "--json"}));
  double hist = 0;
  for (auto const& c : j.find("budget_histogram")->elements()) hist += c.number();
  CHECK(hist == 128);
  for (auto const& row : j.find("split_shares")->elements()) {
    double sum = 0;
    for (auto const& c : row.elements()) sum += c.number();
    CHECK(sum == 264);
  }

  // A profile file plans like the samples it came from under static budgets (elastic weighs the
  // map on the samples' placements, which a profile lacks); hybrid models pick their preset.
  auto profile = tmp("ea-qwen.profile.json");
  REQUIRE(run({"calibrate", "ea/qwen3-4b-instruct-2507", "--out", profile}).code == 0);
  auto a =
      parse_out(run({"plan", "ea/qwen3-4b-instruct-2507", "--json", "--reservation", "static"}));
  auto b = parse_out(run({"plan", profile, "--json", "--reservation", "static"}));
  CHECK(num(a, "group_waste") == num(b, "group_waste"));
  CHECK(num(a, "split_imbalance") == num(b, "split_imbalance"));
  auto g = parse_out(run({"plan", data_path("derived/gemma-3-12b-it.derived.json"), "--json"}));
  CHECK(g.find("model")->string() == "Gemma-3-12B");
  CHECK(num(*g.find("groups_by_kind"), "sliding_window") == 40 * 8);  // one group per head
  CHECK(num(*g.find("groups_by_kind"), "compressed") == 8 * 8);
  // Elastic plans reserve the margin their samples need: the derived GPT-OSS-20B samples' scorer
  // keeps ~11% more than its total; --margin fixes it; the bundled profiles stay at 0.02.
  auto gpt_path = data_path("derived/gpt-oss-20b.derived.json");
  auto gpt      = parse_out(run({"plan", gpt_path, "--json"}));
  auto gpt_samples = load_retention_samples(gpt_path);
  CHECK(num(gpt, "margin") ==
        build_static_plan(model_preset("gpt-oss-20b"), calibrate(gpt_samples), {}, gpt_samples)
            .options.reservation.margin);
  CHECK(num(gpt, "margin") > 0.1);
  CHECK(gpt.find("margin_from_samples")->boolean());
  auto gpt_fixed = parse_out(run({"plan", gpt_path, "--json", "--margin", "0.02"}));
  CHECK(num(gpt_fixed, "margin") == 0.02);
  CHECK_FALSE(gpt_fixed.find("margin_from_samples")->boolean());
  CHECK(num(parse_out(run({"plan", "snapkv/llama-3.1-8b-instruct", "--json"})), "margin") ==
        default_elastic_margin);
  CHECK(num(parse_out(run({"plan", profile, "--json"})), "margin") == default_elastic_margin);
  CHECK(run({"plan", gpt_path}).out.find("(from the samples: mean + 2 sd") != std::string::npos);
  auto q = parse_out(run({"plan",
                          data_path("derived/qwen2.5-7b-instruct.derived.json"),
                          "--json",
                          "--group-size",
                          "8"}));
  CHECK(q.find("model")->string() == "Qwen2.5-7B");
  CHECK(num(q, "num_groups") == 14);
  CHECK(q.find("group_waste_by_scope")->find("layer")->is_null());  // Hp 8 > 4 heads per layer
  auto gi = run({"inspect", path});
  CHECK(gi.code == 0);

  // --model accepts a model-spec file.
  auto spec = tmp("llama.model.json");
  detail::write_file(spec, to_json(model_preset("llama-3.1-8b")));
  auto m = parse_out(run({"plan", "ea/llama-3.1-8b-instruct", "--model", spec, "--json"}));
  CHECK(m.find("model")->string() == "Llama-3.1-8B");
}

TEST_CASE("plan and inspect: bad options and inputs are one-line errors with exit 2",
          "[cli][errors]") {
  auto unknown = tmp("unknown-model.samples.json");
  detail::write_file(
      unknown, R"({"format": "retention-samples/v1", "model": "acme/unknown-9b", "scorer": "s",
    "target_keep_ratio": 0.3, "sink_tokens": 1, "window_tokens": 1, "num_model_layers": 1,
    "layer_ids": [0], "num_kv_heads": 4, "samples": [{"context_tokens": 10, "kept_tokens": [[3, 4, 5, 6]]}]})");
  expect_error({"plan", unknown},
               2,
               {"tangram plan: error: no built-in model matches \"acme/unknown-9b\"; pass --model "
                "NAME_OR_FILE"});
  expect_error({"plan", unknown, "--model", "llama-3.1-8b"},
               2,
               {"num_model_layers: 1 does not match", "Llama-3.1-8B"});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--model", "gpt-7"},
               2,
               {"--model: \"gpt-7\" is neither a model-spec file nor a preset"});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--tp-size", "2", "--tp-rank", "2"},
               2,
               {"--tp-rank: must be in [0, 1] for --tp-size 2, got 2"});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--tp-size", "3"},
               2,
               {"--tp-size: 3 does not divide"});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--group-size", "3", "--scope", "layer"},
               2,
               {"Hp = 3", "scope layer"});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--scope", "diagonal"},
               2,
               {"--scope", "\"diagonal\""});
  expect_error(
      {"plan", "snapkv/llama-3.1-8b-instruct", "--weighting", "vibes"}, 2, {"--weighting"});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--reference-contexts", "1024,,2048"},
               2,
               {"--reference-contexts: expected an integer", "\"\""});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--reference-contexts", "1024,0"},
               2,
               {"--reference-contexts: must be in [1, ", "got 0"});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--share-quantile", "1.5"},
               2,
               {"--share-quantile", "1.5"});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--sms", "2", "--ctas-per-sm", "1"},
               2,
               {"N_CTA = 2", "8 heads"});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--page-tokens", "0"},
               2,
               {"--page-tokens: must be in [1, 4096]"});
  expect_error({"plan"}, 2, {"missing SAMPLES_OR_PROFILE.json"});
  auto profile = tmp("for-plan.profile.json");
  REQUIRE(run({"calibrate", "keydiff/qwen3-4b-instruct-2507", "--out", profile}).code == 0);
  expect_error({"plan", profile, "--alpha", "3"},
               2,
               {"--alpha: calibration options apply to retention samples"});

  auto plan = tmp("for-inspect.plan.json");
  REQUIRE(run({"plan", "keydiff/qwen3-4b-instruct-2507", "--out", plan}).code == 0);
  expect_error(
      {"inspect", "snapkv/llama-3.1-8b-instruct"}, 2, {"expected a tangram-static-plan/v1 file"});
  expect_error({"inspect"}, 2, {"missing PLAN.json"});
  auto text = detail::read_file(plan);
  auto pos  = text.find("\"tp_rank\": 0");
  REQUIRE(pos != std::string::npos);
  auto corrupt = tmp("corrupt.plan.json");
  detail::write_file(corrupt, text.replace(pos, 12, "\"tp_rank\": 9"));
  expect_error(
      {"inspect", corrupt}, 2, {"corrupt.plan.json: options.tp_rank: must be in [0, 0], got 9"});
  expect_error({"inspect", plan, "--svg", "/nonexistent-dir/x.svg"}, 2, {"cannot write", "x.svg"});
}

TEST_CASE("output options are checked before the work and nothing is created",
          "[cli][errors][regression]") {
  // A missing folder or a directory as target: refused up front (before reading inputs or
  // planning), exit 2, naming the option; no file appears.
  auto missing = tmp("no-such-folder") + "/out.json";
  auto folder  = tmp("");
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--out", missing},
               2,
               {"--out: cannot write", "no-such-folder"});
  expect_error({"calibrate", "snapkv/llama-3.1-8b-instruct", "--out", missing},
               2,
               {"--out: cannot write", "no-such-folder"});
  // inspect's input does not even exist: the output check comes first.
  expect_error({"inspect", tmp("absent-plan.json"), "--svg", folder},
               2,
               {"--svg: cannot write", "directory"});
  CHECK_FALSE(std::filesystem::exists(missing));
}

TEST_CASE("plan --reservation elastic: the plan file carries the mode and margin", "[cli]") {
  auto path = tmp("llama.elastic.plan.json");
  auto r    = run({"plan",
                   "snapkv/llama-3.1-8b-instruct",
                   "--reservation",
                   "elastic",
                   "--margin",
                   "0.125",
                   "--out",
                   path});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("reservation: elastic, margin 0.125") != std::string::npos);
  auto p = load_static_plan(path);
  CHECK(p.options.reservation.mode == reservation_mode::elastic);
  CHECK(p.options.reservation.margin == 0.125);
  auto shown = run({"inspect", path});
  CHECK(shown.out.find("reservation: elastic, margin 0.125") != std::string::npos);
  auto iv = parse_out(run({"inspect", path, "--json"}));
  CHECK(iv.find("reservation")->string() == "elastic");
  CHECK(num(iv, "margin") == 0.125);
  auto v =
      parse_out(run({"plan", "snapkv/llama-3.1-8b-instruct", "--json", "--reservation", "static"}));
  CHECK(v.find("reservation")->string() == "static");
  CHECK(v.find("margin")->type() == json::kind::null);
  auto e = parse_out(
      run({"plan", "snapkv/llama-3.1-8b-instruct", "--json", "--reservation", "elastic"}));
  CHECK(e.find("reservation")->string() == "elastic");
  CHECK(num(e, "margin") == 0.02);
  // Elastic is the default: without --reservation the plan is the elastic one, margin included.
  auto d = parse_out(run({"plan", "snapkv/llama-3.1-8b-instruct", "--json"}));
  CHECK(d.find("reservation")->string() == "elastic");
  CHECK(num(d, "margin") == 0.02);
  CHECK(d.find("split_from_placements")->boolean());
  CHECK(num(d, "split_imbalance") == num(e, "split_imbalance"));
  // From samples: the split map is weighed on their placements and the imbalance measured on them
  // (the saved map equals the library's build from the same samples).
  CHECK(e.find("split_from_placements")->boolean());
  CHECK(e.find("imbalance_lengths")->string() == "elastic_placements");
  CHECK(v.find("imbalance_lengths")->string() == "budgets");
  CHECK_FALSE(v.find("split_from_placements")->boolean());
  CHECK(r.out.find("weighting batch_share over elastic placements of the samples") !=
        std::string::npos);
  {
    auto samples = load_retention_samples(
        tangram::test::data_path("profiles/snapkv/llama-3.1-8b-instruct.json"));
    auto o       = p.options;
    auto library = build_static_plan(p.model, calibrate(samples), o, samples);
    CHECK(p.splits.cta_begin == library.splits.cta_begin);
    CHECK(p.splits.cta_begin != build_static_plan(p.model, p.profile, o).splits.cta_begin);
  }
  expect_error(
      {"plan", "snapkv/llama-3.1-8b-instruct", "--reservation", "static", "--margin", "0.1"},
      2,
      {"--margin", "--reservation elastic"});
  expect_error({"plan", "snapkv/llama-3.1-8b-instruct", "--reservation", "dynamic"},
               2,
               {"--reservation", "dynamic"});
  expect_error(
      {"plan", "snapkv/llama-3.1-8b-instruct", "--reservation", "elastic", "--margin", "11"},
      2,
      {"--margin", "11"});
  // A profile without a keep ratio cannot take the default (elastic) reservation: the error names
  // the option, the field and the value, and --reservation static plans it.
  auto profile = tmp("no-keep-ratio.profile.json");
  REQUIRE(run({"calibrate", "snapkv/llama-3.1-8b-instruct", "--out", profile}).code == 0);
  // With its keep ratio a profile plans elastic by default, its map weighed on the groups' rules.
  auto from_profile = run({"plan", profile});
  INFO(from_profile.err);
  REQUIRE(from_profile.code == 0);
  CHECK(from_profile.out.find("reservation: elastic, margin 0.02") != std::string::npos);
  CHECK(from_profile.out.find("over the groups' rules") != std::string::npos);
  auto text = detail::read_file(profile);
  auto at   = text.find("\"target_keep_ratio\":");
  REQUIRE(at != std::string::npos);
  auto value = at + std::string("\"target_keep_ratio\":").size();
  detail::write_file(profile, text.replace(value, text.find(',', value) - value, " 0"));
  expect_error(
      {"plan", profile},
      2,
      {"--reservation: elastic reservation (the default)", "target_keep_ratio", "got 0", "static"});
  CHECK(run({"plan", profile, "--reservation", "static"}).code == 0);
}

TEST_CASE("usage errors name the option and the value, help per command, output failures",
          "[cli][errors][regression]") {
  auto const* P = "snapkv/llama-3.1-8b-instruct";
  expect_error({"plan", P, "--group-size", "4", "--group-size", "8"},
               2,
               {"--group-size: given more than once", "\"4\"", "\"8\""});
  expect_error({"plan", P, "--group-size"}, 2, {"--group-size: needs a value"});
  expect_error({"calibrate", P, "--json=1"}, 2, {"--json: takes no value", "\"1\""});
  expect_error({"plan", P, "--weighting", "budget", "--share-quantile", "0.1"},
               2,
               {"--share-quantile", "--weighting batch_share only"});
  expect_error({"plan", P, "--weighting", "budget", "--reference-contexts", "100,200"},
               2,
               {"--reference-contexts", "--weighting batch_share only"});
  expect_error({"calibrate", P, "--reservation", "elastic", "--band", "0.9"},
               2,
               {"--band", "give --reservation static"});
  expect_error({"plan", P, "--reference-contexts", "5,"}, 2, {"--reference-contexts", "\"5,\""});
  auto help = run({"help", "plan"});
  CHECK(help.code == 0);
  CHECK(help.out.find("Usage: tangram plan") != std::string::npos);
  auto unknown = run({"help", "nope"});
  CHECK(unknown.code == 2);
  CHECK(unknown.err.find("unknown command \"nope\"") != std::string::npos);
  // -0 reads as 0: the report never shows "-0".
  auto zero = run({"calibrate", P, "--reservation", "static", "--alpha", "-0"});
  REQUIRE(zero.code == 0);
  CHECK(zero.out.find("alpha 0,") != std::string::npos);
  CHECK(zero.out.find("-0") == std::string::npos);
  // A failed standard output (a full disk, a closed pipe) is a failed job, exit 1.
  std::ostream broken(nullptr);
  std::ostringstream err;
  CHECK(cli::run({"models"}, {broken, err}) == 1);
  CHECK(err.str().find("cannot write the output") != std::string::npos);
}
