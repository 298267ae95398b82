// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/head_grouping.hpp
 * @brief Head groups: the unit of paging. A group has `group_size` (Hp) member heads, one per page
 * column, all of the same layer kind; with global clustering members may come from different
 * layers. Every (layer, KV head) belongs to exactly one group.
 */
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tangram/core/config.hpp"
#include "tangram/core/detail/enum_names.hpp"
#include "tangram/core/error.hpp"
#include "tangram/core/page_layout.hpp"
#include "tangram/core/retention.hpp"

namespace tangram {

/// @brief Which heads may share a group.
enum class grouping_scope : std::uint8_t {
  adjacent,  ///< heads in index order within a layer (what paging without clustering does)
  layer,     ///< heads sorted by budget within each layer
  global,    ///< heads sorted by budget across all layers of the same kind
};

constexpr std::string_view to_string(grouping_scope s) noexcept {
  switch (s) {
    case grouping_scope::adjacent:
      return "adjacent";
    case grouping_scope::layer:
      return "layer";
    case grouping_scope::global:
      return "global";
  }
  return "?";
}

/// Every grouping scope, in the order a refusal lists them.
inline constexpr grouping_scope all_grouping_scopes[] = {
    grouping_scope::adjacent, grouping_scope::layer, grouping_scope::global};

/// The scope that `to_string` spells `name`, if any.
inline std::optional<grouping_scope> grouping_scope_named(std::string_view name) noexcept {
  return detail::enum_named(name, all_grouping_scopes);
}

/// @brief Parses "adjacent", "layer" or "global".
/// @throw invalid_argument naming `field` and the value.
inline grouping_scope parse_grouping_scope(std::string_view name,
                                           std::string_view field = "scope") {
  return detail::parse_enum(name, all_grouping_scopes, field, "grouping scope");
}

/// @brief A (layer, KV head) pair; `head` is local to the tensor-parallel rank.
struct head_ref {
  std::int32_t layer = 0;
  std::int32_t head  = 0;
  friend bool operator==(head_ref a, head_ref b) { return a.layer == b.layer && a.head == b.head; }
};

/// @brief One head group.
struct head_group {
  head_rule rule;                 ///< the rule of its largest member (sizes the group's pages)
  std::vector<head_ref> members;  ///< column c holds members[c]; size == group_size
};

/**
 * @brief The grouping of all heads of a model (one tensor-parallel rank).
 *
 * Plain value type built by `cluster_heads` (plan/clustering.hpp) or by hand.
 */
struct head_grouping {
  std::int32_t group_size   = 0;  ///< Hp
  grouping_scope scope      = grouping_scope::global;
  std::int32_t num_layers   = 0;
  std::int32_t num_kv_heads = 0;  ///< KV heads per layer on this rank
  std::vector<head_group> groups;
  std::vector<head_slot> slots;  ///< [layer * num_kv_heads + head]

  [[nodiscard]] std::int32_t num_groups() const { return static_cast<std::int32_t>(groups.size()); }
  [[nodiscard]] head_slot slot(std::int32_t layer, std::int32_t head) const {
    return slots[static_cast<std::size_t>(layer) * static_cast<std::size_t>(num_kv_heads) +
                 static_cast<std::size_t>(head)];
  }

  /**
   * @brief Checks that groups and slots describe one bijection between heads and
   * (group, column) cells, and that every group is full (`detail::grouping_fault`).
   * @throw invalid_argument "head_grouping.<field>: <what>" naming the offending group or head.
   */
  void validate() const;
};

namespace detail {

/// @brief A broken invariant of a value: the field that holds it (a path such as
/// `groups[3].members[1]`) and what is wrong, with the values.
struct field_fault {
  std::string field;
  std::string what;
};

/**
 * @brief The first way `g` fails to be one bijection between its heads and the (group, column)
 * cells of full groups, in this order: group_size >= 1, one slot per head, groups covering every
 * head, each group full with members in range and in one group only, then the slots agreeing
 * with the members. nullopt when it is one. Field paths: `group_size`, `slots`, `groups`,
 * `groups[g].members`, `groups[g].members[c]`. The one check behind `head_grouping::validate`
 * and the plan checks (plan/plan_checks.hpp).
 */
inline std::optional<field_fault> grouping_fault(head_grouping const& g) {
  auto fault = [](std::string field, std::string what) {
    return std::optional<field_fault>(field_fault{std::move(field), std::move(what)});
  };
  if (g.group_size < 1) return fault("group_size", cat("must be >= 1, got ", g.group_size));
  if (g.num_layers < 0 || g.num_kv_heads < 0)
    return fault(
        "num_layers",
        cat("num_layers and num_kv_heads must be >= 0, got ", g.num_layers, " x ", g.num_kv_heads));
  auto L = static_cast<std::size_t>(g.num_layers), H = static_cast<std::size_t>(g.num_kv_heads);
  auto n  = L * H;
  auto Hp = static_cast<std::size_t>(g.group_size);
  if (g.slots.size() != n)
    return fault("slots",
                 cat("expected ", n, " entries (num_layers x num_kv_heads), got ", g.slots.size()));
  if (g.groups.size() * Hp != n)
    return fault("groups",
                 cat(g.groups.size(),
                     " groups of ",
                     Hp,
                     " heads (group_size) do not cover the ",
                     n,
                     " heads (num_layers x num_kv_heads)"));
  std::vector<std::int64_t> owner(n, -1);
  for (std::size_t k = 0; k < g.groups.size(); ++k) {
    auto const& members = g.groups[k].members;
    if (members.size() != Hp)
      return fault(cat("groups[", k, "].members"),
                   cat("expected ", Hp, " members (group_size), got ", members.size()));
    for (std::size_t c = 0; c < Hp; ++c) {
      auto m = members[c];
      if (m.layer < 0 || m.layer >= g.num_layers || m.head < 0 || m.head >= g.num_kv_heads)
        return fault(cat("groups[", k, "].members[", c, "]"),
                     cat("head (",
                         m.layer,
                         ", ",
                         m.head,
                         ") out of range (num_layers x num_kv_heads = ",
                         g.num_layers,
                         " x ",
                         g.num_kv_heads,
                         ")"));
      auto idx = static_cast<std::size_t>(m.layer) * H + static_cast<std::size_t>(m.head);
      if (owner[idx] >= 0)
        return fault(cat("groups[", k, "].members[", c, "]"),
                     cat("head (",
                         m.layer,
                         ", ",
                         m.head,
                         ") is in more than one group: already a member of groups[",
                         owner[idx],
                         "]"));
      owner[idx] = static_cast<std::int64_t>(k);
    }
  }
  for (std::size_t k = 0; k < g.groups.size(); ++k) {
    for (std::size_t c = 0; c < Hp; ++c) {
      auto m = g.groups[k].members[c];
      auto s = g.slots[static_cast<std::size_t>(m.layer) * H + static_cast<std::size_t>(m.head)];
      if (s.group != static_cast<std::int32_t>(k) || s.column != static_cast<std::int32_t>(c))
        return fault("slots",
                     cat("head (",
                         m.layer,
                         ", ",
                         m.head,
                         ") maps to (group ",
                         s.group,
                         ", column ",
                         s.column,
                         ") but is member ",
                         c,
                         " of groups[",
                         k,
                         "]"));
    }
  }
  return std::nullopt;
}

/// The rule that sizes a group of `members`: its first member's rule with the largest member
/// budget (what `cluster_heads` assigns, and what a plan's group rules must be). `rules` is
/// [num_layers * num_kv_heads]; members must be in range and not empty.
inline head_rule group_rule_of(std::vector<head_ref> const& members,
                               std::vector<head_rule> const& rules,
                               std::int32_t num_kv_heads) {
  auto at = [&](head_ref m) -> head_rule const& {
    return rules[static_cast<std::size_t>(m.layer) * static_cast<std::size_t>(num_kv_heads) +
                 static_cast<std::size_t>(m.head)];
  };
  head_rule r = at(members.front());
  for (auto m : members) r.budget = std::max(r.budget, at(m).budget);
  return r;
}

}  // namespace detail

inline void head_grouping::validate() const {
  if (auto f = detail::grouping_fault(*this))
    TANGRAM_FAIL(invalid_argument, "head_grouping.", f->field, ": ", f->what);
}

}  // namespace tangram
