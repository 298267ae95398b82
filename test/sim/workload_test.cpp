// SPDX-License-Identifier: Apache-2.0
#include "tangram/eval/sim/workload.hpp"
#include "tangram/eval/io/workload_io.hpp"

#include "tangram/model/presets.hpp"
#include "tangram/eval/sim/cost_model.hpp"
#include "test_support.hpp"

using namespace tangram;
using namespace tangram::sim;

TEST_CASE("generated workloads follow their traffic class", "[workload]") {
  struct cls {
    workload_kind kind;
    std::int64_t lo, hi;
  } classes[] = {{workload_kind::short_context, 4096, 20000},
                 {workload_kind::mid_context, 20000, 100000},
                 {workload_kind::long_context, 100000, 120000}};
  for (auto c : classes) {
    workload_options o;
    o.kind     = c.kind;
    o.sessions = 300;
    o.turns    = 4;
    auto w     = generate_workload(o);
    REQUIRE(w.sessions.size() == 300);
    for (auto const& s : w.sessions) {
      REQUIRE(s.turns.size() == 4);
      CHECK(s.arrival_s == 0.0);
      CHECK(s.total_tokens() <= o.max_context);
      CHECK(s.turns[0].prompt_tokens >= std::min<std::int64_t>(c.lo, 1024));
      CHECK(s.turns[0].prompt_tokens <= c.hi);
      for (std::size_t k = 1; k < s.turns.size(); ++k) {
        CHECK(s.turns[k].prompt_tokens >= 64);
        CHECK(s.turns[k].prompt_tokens <= 512);
      }
      for (auto const& t : s.turns) {
        CHECK(t.output_tokens >= 64);
        CHECK(t.output_tokens <= 512);
      }
      CHECK(s.turns.back().think_s == 0.0);
    }
  }
}

TEST_CASE("workload generation is deterministic and arrivals are Poisson-spaced", "[workload]") {
  workload_options o;
  o.arrival_rate = 2.0;
  o.sessions     = 2000;
  auto a = generate_workload(o), b = generate_workload(o);
  CHECK(to_json(a) == to_json(b));
  o.seed = 2;
  CHECK(to_json(generate_workload(o)) != to_json(a));
  double last = a.sessions.back().arrival_s;
  CHECK(last / 2000 == Approx(0.5).epsilon(0.1));  // mean gap 1/rate
  for (std::size_t i = 1; i < a.sessions.size(); ++i) CHECK(a.sessions[i].arrival_s >= a.sessions[i - 1].arrival_s);
}

TEST_CASE("workload traces round-trip and bad traces name the field", "[workload][errors]") {
  workload_options o;
  o.sessions = 5;
  auto w    = generate_workload(o);
  auto back = parse_workload(to_json(w), "t");
  REQUIRE(back.sessions.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK(back.sessions[i].turns.size() == w.sessions[i].turns.size());
    CHECK(back.sessions[i].turns[1].think_s == w.sessions[i].turns[1].think_s);
    CHECK(back.sessions[i].turns[0].prompt_tokens == w.sessions[i].turns[0].prompt_tokens);
  }
  std::string good = R"({"format": "tangram-workload/v1", "sessions": [{"arrival_s": 0, "turns": [{"prompt_tokens": 100, "output_tokens": 10}]}]})";
  CHECK(parse_workload(good, "w.json").sessions[0].turns[0].think_s == 0.0);
  auto bad = [&](std::string const& from, std::string const& to) {
    std::string t = good;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_workload(bad("\"prompt_tokens\": 100", "\"prompt_tokens\": 0"), "w.json"),
                                  parse_error, "w.json: sessions[0].turns[0].prompt_tokens", "got 0");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_workload(bad("\"arrival_s\": 0", "\"arrival_s\": -1"), "w.json"),
                                  parse_error, "sessions[0].arrival_s", "got -1");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_workload(bad("tangram-workload/v1", "tangram-workload/v7"), "w.json"),
                                  parse_error, "format", "\"tangram-workload/v7\"");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_workload(bad("\"output_tokens\": 10", "\"output_tokens\": 1.5"), "w.json"),
                                  parse_error, "turns[0].output_tokens", "expected an integer");
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_workload(bad("[{\"prompt_tokens\": 100, \"output_tokens\": 10}]", "[]"), "w.json"),
                                  parse_error, "sessions[0].turns", "got 0");
  // Bounded work: a session beyond 2^31 - 1 tokens, a trace beyond 2^28 answer tokens.
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_workload(bad("{\"prompt_tokens\": 100, \"output_tokens\": 10}",
                         "{\"prompt_tokens\": 1073741824, \"output_tokens\": 1073741824}"), "w.json"),
      parse_error, "sessions[0].turns", "2147483648 tokens", "limit of 2147483647");
  std::string many = R"({"format": "tangram-workload/v1", "sessions": [)";
  for (int i = 0; i < 3; ++i)
    many += std::string(i ? "," : "") + R"({"arrival_s": 0, "turns": [{"prompt_tokens": 10, "output_tokens": 100000000}]})";
  many += "]}";
  TANGRAM_REQUIRE_THROWS_WITH_ALL(parse_workload(many, "w.json"), parse_error, "w.json: sessions",
                                  "more than 268435456 answer tokens", "session 2");
  // A request's own max_tokens: optional, round-trips, bounded like the other token counts.
  auto own = parse_workload(bad("\"output_tokens\": 10", "\"output_tokens\": 10, \"max_tokens\": 256"), "w.json");
  CHECK(own.sessions[0].turns[0].max_tokens == 256);
  CHECK(parse_workload(to_json(own), "t").sessions[0].turns[0].max_tokens == 256);
  CHECK(parse_workload(good, "w.json").sessions[0].turns[0].max_tokens == 0);  // absent: the run's
  CHECK(to_json(parse_workload(good, "w.json")).find("max_tokens") == std::string::npos);
  TANGRAM_REQUIRE_THROWS_WITH_ALL(
      parse_workload(bad("\"output_tokens\": 10", "\"output_tokens\": 10, \"max_tokens\": 0"), "w.json"),
      parse_error, "turns[0].max_tokens", "got 0");
  // The reservation: the turn's own, else the run's, capped by the context left, at least 1.
  turn_spec t;
  CHECK(t.reservation(4096, 100000) == 4096);
  CHECK(t.reservation(4096, 1000) == 1000);
  CHECK(t.reservation(4096, 0) == 1);
  t.max_tokens = 300;
  CHECK(t.reservation(4096, 100000) == 300);
  CHECK(t.reservation(4096, 200) == 200);
  workload_options neg;
  neg.sessions = 0;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(generate_workload(neg), invalid_argument, "workload.sessions", "got 0");
}

TEST_CASE("roofline cost model matches hand-worked figures", "[cost]") {
  auto m = model_preset("llama-3.1-8b");
  cost_model cm(m, gpu_spec{});
  // Decode: (16.06e9 weights + 10e9 KV) / 4.8e12 B/s.
  CHECK(cm.decode_step_s(10e9) == Approx((8.03e9 * 2 + 10e9) / 4.8e12));
  // Prefill of 1000 tokens after 3000: 2 * 8.03e9 * 1000 + 4 * 32 * 128 * 32 * 1000 * (500 + 3000).
  double flops = 2 * 8.03e9 * 1000 + 4.0 * 32 * 128 * 32 * 1000 * 3500;
  CHECK(cm.prefill_s(1000, 3000) == Approx(flops / 989e12));
  CHECK(gpu_spec{}.kv_budget_bytes(m) == Approx(141e9 * 0.9 - 16.06e9));
  gpu_spec bad;
  bad.usable_fraction = 1.5;
  TANGRAM_REQUIRE_THROWS_WITH_ALL(cost_model(m, bad), invalid_argument, "usable_fraction", "1.5");
}

TEST_CASE("first-turn contexts follow the chosen distribution's bounds and mean", "[workload][context_dist]") {
  constexpr double lo = 20000, hi = 100000;
  // Independent expectations: the means of the three distributions on [lo, hi].
  struct expect {
    context_dist dist;
    double mean;
  } cases[] = {{context_dist::loguniform, (hi - lo) / std::log(hi / lo)},  // 49,707
               {context_dist::uniform, (lo + hi) / 2},                        // 60,000
               {context_dist::fixed, (lo + hi) / 2}};
  std::vector<std::vector<std::int64_t>> answers;
  for (auto c : cases) {
    INFO(to_string(c.dist));
    workload_options o;
    o.sessions   = 4000;
    o.turns      = 2;
    o.context_lo = static_cast<std::int64_t>(lo);
    o.context_hi = static_cast<std::int64_t>(hi);
    o.contexts   = c.dist;
    auto w       = generate_workload(o);
    double sum = 0, below_mid = 0;
    std::vector<std::int64_t> outs;
    for (auto const& s : w.sessions) {
      auto ctx = s.turns[0].prompt_tokens;  // 100K + 2 turns fit 131072: never shortened
      CHECK(ctx >= static_cast<std::int64_t>(lo));
      CHECK(ctx <= static_cast<std::int64_t>(hi));
      if (c.dist == context_dist::fixed) CHECK(ctx == 60000);
      sum += static_cast<double>(ctx);
      below_mid += ctx < 60000;
      for (auto const& t : s.turns) outs.push_back(t.output_tokens);
    }
    double n = static_cast<double>(w.sessions.size());
    // 4000 draws: the standard error of the mean is under 400 tokens for either spread; 2% is
    // more than three of them.
    CHECK(sum / n == Approx(c.mean).epsilon(0.02));
    // The shapes differ beyond the mean: log-uniform puts ln(3)/ln(5) = 68% below the midpoint,
    // uniform half.
    if (c.dist == context_dist::loguniform) CHECK(below_mid / n == Approx(std::log(3.0) / std::log(5.0)).margin(0.03));
    if (c.dist == context_dist::uniform) CHECK(below_mid / n == Approx(0.5).margin(0.03));
    answers.push_back(std::move(outs));
  }
  // The other draws are the same at a seed whatever the distribution.
  CHECK(answers[0] == answers[1]);
  CHECK(answers[0] == answers[2]);
  CHECK(context_dist_named("uniform") == context_dist::uniform);
  CHECK_FALSE(context_dist_named("normal").has_value());
}

TEST_CASE("the default context distribution is the log-uniform one the generator always drew",
          "[workload][context_dist]") {
  workload_options o;
  o.sessions = 50;
  auto w     = generate_workload(o);
  // The same draws, made here by hand: a log-uniform first-turn context per session.
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> log_ctx(std::log(20000.0), std::log(100000.0));
  std::uniform_int_distribution<std::int64_t> small(64, 512);
  std::exponential_distribution<double> think(1.0 / o.think_mean_s);
  for (auto const& s : w.sessions) {
    for (std::size_t k = 0; k < s.turns.size(); ++k) {
      auto prompt = k == 0 ? static_cast<std::int64_t>(std::exp(log_ctx(rng))) : small(rng);
      auto out    = small(rng);
      if (k + 1 < s.turns.size()) think(rng);
      if (k == 0 && s.total_tokens() <= o.max_context) CHECK(s.turns[0].prompt_tokens == prompt);
      CHECK(s.turns[k].output_tokens == out);
    }
  }
}
