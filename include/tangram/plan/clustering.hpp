// SPDX-License-Identifier: Apache-2.0
/**
 * @file plan/clustering.hpp
 * @brief Budget-aware clustering: put heads with similar budgets into groups of Hp heads, so a
 * group (sized by its largest member) wastes little.
 *
 * For equal-size groups, sorting by budget and cutting the sorted list into consecutive chunks
 * minimises the total of (group size x largest member): an exchange argument shows any grouping
 * can be rearranged into sorted chunks without increasing the cost (tests check it by brute force).
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "tangram/core/error.hpp"
#include "tangram/core/retention.hpp"
#include "tangram/plan/head_grouping.hpp"

namespace tangram {

/**
 * @brief Groups the heads of a model.
 * @param rules     [num_layers * num_kv_heads] retention rule of every head
 * @param group_size Hp
 * @param scope     adjacent / layer (within each layer) or global (across layers of one kind)
 *
 * Heads of different kinds (or sliding windows) never share a group. Within a group, columns are
 * in (layer, head) order. Compressed heads are ordered by budget (descending, ties by layer then
 * head) under the `layer` and `global` scopes; other kinds have identical rules, so they are
 * grouped in index order.
 * @throw invalid_argument when Hp does not divide the number of heads of a scope, naming both.
 */
inline head_grouping cluster_heads(std::vector<head_rule> const& rules,
                                   std::int32_t num_layers,
                                   std::int32_t num_kv_heads,
                                   std::int32_t group_size,
                                   grouping_scope scope) {
  TANGRAM_EXPECTS(num_layers >= 1 && num_kv_heads >= 1,
                  invalid_argument,
                  "cluster_heads: need at least one layer and one head, got ",
                  num_layers,
                  " x ",
                  num_kv_heads);
  TANGRAM_EXPECTS(rules.size() == static_cast<std::size_t>(num_layers) * num_kv_heads,
                  invalid_argument,
                  "cluster_heads: expected ",
                  num_layers * num_kv_heads,
                  " rules, got ",
                  rules.size());
  TANGRAM_EXPECTS(group_size >= 1, invalid_argument, "group_size: must be >= 1, got ", group_size);

  head_grouping out;
  out.group_size   = group_size;
  out.scope        = scope;
  out.num_layers   = num_layers;
  out.num_kv_heads = num_kv_heads;
  out.slots.resize(rules.size());

  auto rule_of = [&](head_ref r) -> head_rule const& {
    return rules[static_cast<std::size_t>(r.layer) * num_kv_heads + r.head];
  };
  // Bucket key: heads may share a group only within one bucket (kind, window, protect) and,
  // unless the scope is global, one layer.
  using key = std::tuple<std::int32_t, int, std::int32_t, std::int64_t>;
  std::map<key, std::vector<head_ref>> buckets;
  for (std::int32_t l = 0; l < num_layers; ++l) {
    for (std::int32_t h = 0; h < num_kv_heads; ++h) {
      auto const& r          = rule_of({l, h});
      std::int32_t layer_key = scope == grouping_scope::global ? -1 : l;
      buckets[key{layer_key, static_cast<int>(r.kind), r.window, r.protect}].push_back({l, h});
    }
  }
  // Emit buckets in the order their first head appears, so group ids follow the layers.
  std::vector<std::pair<head_ref, key>> order;
  for (auto const& [k, members] : buckets) order.emplace_back(members.front(), k);
  std::sort(order.begin(), order.end(), [](auto const& a, auto const& b) {
    return std::tie(a.first.layer, a.first.head) < std::tie(b.first.layer, b.first.head);
  });

  for (auto const& [first, k] : order) {
    std::vector<head_ref> members = buckets[k];
    auto kind                     = static_cast<layer_kind>(std::get<1>(k));
    if (members.size() % static_cast<std::size_t>(group_size) != 0) {
      std::string where =
          scope == grouping_scope::global
              ? std::string("the model (scope global)")
              : detail::cat("layer ", first.layer, " (scope ", to_string(scope), ")");
      TANGRAM_FAIL(invalid_argument,
                   "group_size: Hp = ",
                   group_size,
                   " does not divide the ",
                   members.size(),
                   " ",
                   to_string(kind),
                   " heads of ",
                   where);
    }
    if (kind == layer_kind::compressed && scope != grouping_scope::adjacent) {
      std::stable_sort(members.begin(), members.end(), [&](head_ref a, head_ref b) {
        double ba = rule_of(a).budget, bb = rule_of(b).budget;
        if (ba != bb) return ba > bb;
        return std::tie(a.layer, a.head) < std::tie(b.layer, b.head);
      });
    }
    for (std::size_t start = 0; start < members.size();
         start += static_cast<std::size_t>(group_size)) {
      head_group g;
      g.members.reserve(static_cast<std::size_t>(group_size));
      for (std::size_t i = start; i < start + static_cast<std::size_t>(group_size); ++i)
        g.members.push_back(members[i]);
      std::sort(g.members.begin(), g.members.end(), [](head_ref a, head_ref b) {
        return std::tie(a.layer, a.head) < std::tie(b.layer, b.head);
      });
      g.rule   = detail::group_rule_of(g.members, rules, num_kv_heads);
      auto gid = static_cast<std::int32_t>(out.groups.size());
      for (std::size_t c = 0; c < g.members.size(); ++c) {
        auto m                                                               = g.members[c];
        out.slots[static_cast<std::size_t>(m.layer) * num_kv_heads + m.head] = {
            gid, static_cast<std::int32_t>(c)};
      }
      out.groups.push_back(std::move(g));
    }
  }
  return out;
}

/**
 * @brief Group waste of the compressed heads:
 * (sum over groups of size x largest member budget) / (sum of member budgets) - 1.
 * Zero when the model has no compressed head.
 */
inline double group_waste(head_grouping const& grouping, std::vector<head_rule> const& rules) {
  double sized = 0, total = 0;
  for (auto const& g : grouping.groups) {
    if (g.rule.kind != layer_kind::compressed) continue;
    sized += static_cast<double>(g.members.size()) * g.rule.budget;
    for (auto m : g.members)
      total += rules[static_cast<std::size_t>(m.layer) * grouping.num_kv_heads + m.head].budget;
  }
  return total > 0 ? sized / total - 1.0 : 0.0;
}

}  // namespace tangram
