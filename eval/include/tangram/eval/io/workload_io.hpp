// SPDX-License-Identifier: Apache-2.0
/**
 * @file eval/io/workload_io.hpp
 * @brief The `tangram-workload/v1` trace format (docs/formats.md): writer, parser and file
 * reader of `tangram::sim::workload`. Evaluation code: not installed. Pure functions; the
 * reader enforces `workload_limits` so a hostile trace cannot ask for unbounded work.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "tangram/core/error.hpp"
#include "tangram/eval/sim/workload.hpp"
#include "tangram/io/detail/fields.hpp"
#include "tangram/io/detail/file_io.hpp"
#include "tangram/io/detail/json.hpp"

namespace tangram::sim {

/// @brief Serialises a workload as `tangram-workload/v1` JSON.
inline std::string to_json(workload const& w) {
  namespace json = detail::json;
  auto sessions  = json::value::array();
  for (auto const& s : w.sessions) {
    auto turns = json::value::array();
    for (auto const& t : s.turns) {
      auto o = json::value::object();
      o.set("prompt_tokens", t.prompt_tokens);
      o.set("output_tokens", t.output_tokens);
      o.set("think_s", t.think_s);
      if (t.max_tokens > 0) o.set("max_tokens", t.max_tokens);
      turns.push_back(std::move(o));
    }
    auto o = json::value::object();
    o.set("arrival_s", s.arrival_s);
    o.set("turns", std::move(turns));
    sessions.push_back(std::move(o));
  }
  auto doc = json::value::object();
  doc.set("format", "tangram-workload/v1");
  doc.set("name", w.name);
  doc.set("sessions", std::move(sessions));
  return json::dump(doc);
}

/**
 * @brief Parses a `tangram-workload/v1` trace.
 * @throw parse_error naming the source, the field path and the value.
 */
inline workload parse_workload(std::string_view text, std::string_view source) {
  namespace json = detail::json;
  detail::format_document file(text, source, "tangram-workload/v1");
  auto const& doc = file.root;
  workload w;
  if (auto n = doc.find("name")) w.name = n->as_string(256);
  auto sessions     = doc["sessions"];
  std::size_t count = sessions.expect_size_in(1, workload_limits::max_sessions);
  w.sessions.reserve(count);
  std::int64_t total = 0, answers = 0;
  for (std::size_t i = 0; i < count; ++i) {
    auto s = sessions[i];
    session_spec sess;
    sess.arrival_s = s["arrival_s"].as_double(0, workload_limits::max_seconds);
    auto turns     = s["turns"];
    std::size_t nt = turns.expect_size_in(1, workload_limits::max_turns);
    for (std::size_t k = 0; k < nt; ++k) {
      auto t = turns[k];
      turn_spec turn;
      turn.prompt_tokens = t["prompt_tokens"].as_int(1, workload_limits::max_tokens);
      turn.output_tokens = t["output_tokens"].as_int(1, workload_limits::max_tokens);
      if (auto think = t.find("think_s"))
        turn.think_s = think->as_double(0, workload_limits::max_seconds);
      if (auto mt = t.find("max_tokens"))
        turn.max_tokens = mt->as_int(1, workload_limits::max_tokens);
      sess.turns.push_back(turn);
    }
    // Bounded work: a session must fit in 32-bit token positions, and the whole trace in a replay
    // that finishes (the replay's cost grows with the answer tokens: one decode step each).
    std::int64_t tokens = sess.total_tokens();
    if (tokens > workload_limits::max_session_tokens)
      s["turns"].fail(detail::cat("the session's prompts and answers total ",
                                  tokens,
                                  " tokens, more than the limit of ",
                                  workload_limits::max_session_tokens));
    total += tokens;
    for (auto const& t : sess.turns) answers += t.output_tokens;
    if (total > workload_limits::max_total_tokens)
      sessions.fail(detail::cat("the trace totals more than ",
                                workload_limits::max_total_tokens,
                                " tokens (reached at session ",
                                i,
                                ")"));
    if (answers > workload_limits::max_total_answer_tokens)
      sessions.fail(detail::cat("the trace asks for more than ",
                                workload_limits::max_total_answer_tokens,
                                " answer tokens (reached at session ",
                                i,
                                ")"));
    w.sessions.push_back(std::move(sess));
  }
  return w;
}

/// @brief Reads a `tangram-workload/v1` file.
inline workload load_workload(std::string const& path) {
  return parse_workload(detail::read_file(path), path);
}

}  // namespace tangram::sim
