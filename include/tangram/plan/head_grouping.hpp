// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/head_grouping.hpp
 * @brief Head groups: the unit of paging. A group has `group_size` (Hp) member heads, one per page
 * column, all of the same layer kind; with global clustering members may come from different
 * layers. Every (layer, KV head) belongs to exactly one group.
 */
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tangram/config.hpp"
#include "tangram/error.hpp"
#include "tangram/plan/retention.hpp"

namespace tangram {

/// @brief Which heads may share a group.
enum class grouping_scope : std::uint8_t {
  adjacent,  ///< heads in index order within a layer (what paging without clustering does)
  layer,     ///< heads sorted by budget within each layer
  global,    ///< heads sorted by budget across all layers of the same kind
};

constexpr std::string_view to_string(grouping_scope s) noexcept {
  switch (s) {
    case grouping_scope::adjacent: return "adjacent";
    case grouping_scope::layer: return "layer";
    case grouping_scope::global: return "global";
  }
  return "?";
}

/// The scope that `to_string` spells `name`, if any.
inline std::optional<grouping_scope> grouping_scope_named(std::string_view name) noexcept {
  for (auto s : {grouping_scope::adjacent, grouping_scope::layer, grouping_scope::global})
    if (to_string(s) == name) return s;
  return std::nullopt;
}

/// @brief Parses "adjacent", "layer" or "global".
/// @throw invalid_argument naming `field` and the value.
inline grouping_scope parse_grouping_scope(std::string_view name, std::string_view field = "scope") {
  if (auto s = grouping_scope_named(name)) return *s;
  TANGRAM_FAIL(invalid_argument, field, ": unknown grouping scope ", detail::quoted(name),
               " (expected adjacent, layer or global)");
}

/// @brief A (layer, KV head) pair; `head` is local to the tensor-parallel rank.
struct head_ref {
  std::int32_t layer = 0;
  std::int32_t head  = 0;
  friend bool operator==(head_ref a, head_ref b) { return a.layer == b.layer && a.head == b.head; }
};

/// @brief Where a head lives: its group and its column in the group's pages. POD, device-usable.
struct head_slot {
  std::int32_t group  = 0;
  std::int32_t column = 0;
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
  std::vector<head_slot> slots;   ///< [layer * num_kv_heads + head]

  [[nodiscard]] std::int32_t num_groups() const { return static_cast<std::int32_t>(groups.size()); }
  [[nodiscard]] head_slot slot(std::int32_t layer, std::int32_t head) const {
    return slots[static_cast<std::size_t>(layer) * static_cast<std::size_t>(num_kv_heads) +
                 static_cast<std::size_t>(head)];
  }

  /**
   * @brief Checks that groups and slots describe one bijection between heads and
   * (group, column) cells, that every group is full and single-kind.
   * @throw invalid_argument naming the offending group/head.
   */
  void validate() const {
    TANGRAM_EXPECTS(group_size >= 1, invalid_argument, "head_grouping.group_size: must be >= 1, got ",
                    group_size);
    auto n = static_cast<std::size_t>(num_layers) * static_cast<std::size_t>(num_kv_heads);
    TANGRAM_EXPECTS(slots.size() == n, invalid_argument, "head_grouping.slots: expected ", n,
                    " entries, got ", slots.size());
    TANGRAM_EXPECTS(groups.size() * static_cast<std::size_t>(group_size) == n, invalid_argument,
                    "head_grouping.groups: ", groups.size(), " groups of ", group_size,
                    " do not cover ", n, " heads");
    std::vector<char> seen(n, 0);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      auto const& grp = groups[g];
      TANGRAM_EXPECTS(grp.members.size() == static_cast<std::size_t>(group_size), invalid_argument,
                      "head_grouping.groups[", g, "]: expected ", group_size, " members, got ",
                      grp.members.size());
      for (std::size_t c = 0; c < grp.members.size(); ++c) {
        auto m = grp.members[c];
        TANGRAM_EXPECTS(m.layer >= 0 && m.layer < num_layers && m.head >= 0 && m.head < num_kv_heads,
                        invalid_argument, "head_grouping.groups[", g, "].members[", c,
                        "]: head (", m.layer, ", ", m.head, ") out of range");
        auto idx = static_cast<std::size_t>(m.layer) * static_cast<std::size_t>(num_kv_heads) +
                   static_cast<std::size_t>(m.head);
        TANGRAM_EXPECTS(!seen[idx], invalid_argument, "head_grouping: head (", m.layer, ", ",
                        m.head, ") is in more than one group");
        seen[idx] = 1;
        TANGRAM_EXPECTS(slots[idx].group == static_cast<std::int32_t>(g) &&
                            slots[idx].column == static_cast<std::int32_t>(c),
                        invalid_argument, "head_grouping.slots: head (", m.layer, ", ", m.head,
                        ") maps to (", slots[idx].group, ", ", slots[idx].column,
                        ") but is member ", c, " of group ", g);
      }
    }
  }
};

}  // namespace tangram
