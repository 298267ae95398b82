// SPDX-License-Identifier: Apache-2.0
// Thousands of random operations (admit, chunk with fused eviction, decode, mixed steps of
// prefill chunks beside decodes on two padded batches, fork, end turn,
// continue, free, abort mid-chunk, park (ended sessions and turns in decode) / complete_park /
// cancel_park / try_unpark / try_resume through a host copy of the pages) across many sequences
// on random tiny plans. After every
// operation the engine_sim checks, independently of the manager's own bookkeeping: every held
// token's K/V read back through the view, each group's page count / target / reservation from the
// footprint formulas, reference counts = owners found in the page lists, used + reserved <=
// capacity. Random misuses are interleaved; each must throw logic_error and leave every
// observable number unchanged.
#include <numeric>

#include "engine_sim.hpp"
#include "memory_fixtures.hpp"

using namespace tangram;
using namespace tangram::test;

namespace {

template <class T>
T pick(std::vector<T> const& v, std::mt19937& rng) {
  return v[rng() % v.size()];
}

std::int64_t uniform(std::mt19937& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

}  // namespace

TEST_CASE("random lifecycles keep pages, references, reservations and data consistent",
          "[memory][manager][property]") {
  const int trials = 6, ops = 1500;
  std::int64_t total_ops = 0, misuses = 0, forks = 0, rejections = 0, continues = 0;
  std::int64_t parks = 0, cancels = 0, unparks = 0, unpark_refusals = 0, shared_parks = 0;
  std::int64_t running_parks = 0, resumes = 0, resume_refusals = 0;
  std::int64_t mixed_steps = 0, padded_requests = 0;
  for (int trial = 0; trial < trials; ++trial) {
    std::mt19937 rng(1000 + static_cast<std::uint32_t>(trial));
    std::vector<double> budgets(8);
    for (auto& b : budgets) b = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
    std::int32_t P      = static_cast<std::int32_t>(uniform(rng, 2, 5));
    std::int32_t Hp     = pick<std::int32_t>({1, 2, 4}, rng);
    std::int32_t window = static_cast<std::int32_t>(uniform(rng, 3, 12));
    auto scope          = pick<grouping_scope>(
        {grouping_scope::global, grouping_scope::layer, grouping_scope::adjacent}, rng);
    if (Hp == 4 && scope != grouping_scope::global) scope = grouping_scope::layer;
    auto plan = tiny_plan(budgets, P, Hp, window, scope);
    host_memory_resource mr;
    manager_options o;
    o.num_pages      = uniform(rng, 80, 400);
    o.max_sequences  = static_cast<std::int32_t>(uniform(rng, 4, 10));
    o.index_capacity = trial % 2 == 0 ? 0 : o.num_pages + 50;  // small arenas force repacking
    kv_cache_manager m(plan, mr, o);
    engine_sim sim(m, static_cast<std::uint32_t>(trial), 0.25);
    std::vector<sequence_id> graveyard;
    // Parking: sequences between park and complete_park (with their host copy once taken), and
    // sessions held in host memory (restorable, possibly several times).
    struct parking_entry {
      sequence_id id;
      parked_session session;
      std::vector<std::byte> host;
      bool copied = false;
    };
    std::vector<parking_entry> parking;
    std::vector<engine_sim::parked> parked;
    INFO("trial " << trial << " P " << P << " Hp " << Hp << " W " << window << " scope "
                  << to_string(scope));

    auto in_phase = [&](sequence_phase ph) {
      std::vector<sequence_id> out;
      for (auto const& [s, q] : sim.sequences())
        if (q.phase == ph) out.push_back(q.id);
      return out;
    };
    auto misuse = [&](auto&& call, char const* piece) {
      auto ids    = sim.ids();
      auto before = snapshot(m, ids);
      bool threw  = false;
      try {
        call();
      } catch (logic_error const& e) {
        threw = std::string(e.what()).find(piece) != std::string::npos;
        INFO(e.what());
        CHECK(threw);
      }
      REQUIRE(threw);
      REQUIRE(snapshot(m, ids) == before);
      ++misuses;
    };

    for (int step = 0; step < ops; ++step) {
      // Sequences another op freed are no longer parking.
      parking.erase(std::remove_if(parking.begin(),
                                   parking.end(),
                                   [&](parking_entry const& e) { return !m.contains(e.id); }),
                    parking.end());
      int op = static_cast<int>(rng() % 100);
      if (rng() % 100 < 10) {
        // Host offload: park an ended session or a turn in decode (copy it out now or just
        // before completing), complete or cancel a park, restore a parked session with its next
        // turn or resume a parked turn.
        int kind   = static_cast<int>(rng() % 3);
        auto ended = in_phase(sequence_phase::ended);
        auto dec   = in_phase(sequence_phase::decode);
        if (!dec.empty() && rng() % 3 == 0) ended = dec;  // a running turn this time
        if (kind == 0 && !ended.empty()) {
          auto id = pick(ended, rng);
          running_parks += m.info(id).phase == sequence_phase::decode;
          for (std::int32_t g = 0; g < m.num_groups(); ++g)
            for (std::int32_t p = 0; p < m.group_page_count(id, g); ++p)
              if (m.pool().ref_count(m.group_pages(id, g)[p]) > 1) {
                ++shared_parks;
                g = m.num_groups();
                break;
              }
          parking_entry e{id, sim.park(id), {}, false};
          if (rng() % 2) {
            e.host   = sim.copy_out(e.session);
            e.copied = true;
          }
          parking.push_back(std::move(e));
          ++parks;
        } else if (kind == 1 && !parking.empty()) {
          auto k  = rng() % parking.size();
          auto& e = parking[k];
          if (rng() % 5 == 0) {
            sim.cancel_park(e.id);
            ++cancels;
          } else {
            if (!e.copied) e.host = sim.copy_out(e.session);
            parked.push_back(sim.complete_park(e.id, std::move(e.session), std::move(e.host)));
            graveyard.push_back(e.id);
            if (parked.size() > 6) parked.erase(parked.begin() + static_cast<long>(rng() % 6));
          }
          parking.erase(parking.begin() + static_cast<long>(k));
        } else if (kind == 2 && !parked.empty() &&
                   parked[static_cast<std::size_t>(step) % parked.size()].session.mid_turn) {
          // Resume a parked turn with what it had reserved, or more (its next window).
          auto k    = static_cast<std::size_t>(step) % parked.size();
          auto T    = parked[k].session.max_new + uniform(rng, 0, 6);
          auto need = m.resume_pages(parked[k].session, T);
          bool fits = m.live_sequences() < m.max_sequences() && need <= m.pool().available_pages();
          auto ids  = sim.ids();
          auto before = snapshot(m, ids);
          auto back   = sim.resume(parked[k], T);
          if (!fits) REQUIRE_FALSE(back);
          if (back) {
            ++resumes;
            if (rng() % 2) parked.erase(parked.begin() + static_cast<long>(k));
          } else {
            ++resume_refusals;
            REQUIRE(snapshot(m, ids) == before);  // does not fit: nothing changed
          }
        } else if (kind == 2 && !parked.empty()) {
          auto k = static_cast<std::size_t>(step) % parked.size();  // ended before it was parked
          auto N = uniform(rng, 1, 20), T = uniform(rng, 0, 15);
          auto need = m.unpark_pages(parked[k].session, N, T);
          bool fits = m.live_sequences() < m.max_sequences() && need <= m.pool().available_pages();
          auto ids  = sim.ids();
          auto before = snapshot(m, ids);
          auto back   = sim.unpark(parked[k], N, T);
          if (!fits) REQUIRE_FALSE(back);
          if (back) {
            ++unparks;
            REQUIRE(m.info(*back).reserved_pages == need - parked[k].session.host_pages());
            if (rng() % 2) parked.erase(parked.begin() + static_cast<long>(k));
          } else {
            ++unpark_refusals;
            REQUIRE(snapshot(m, ids) == before);  // does not fit: nothing changed
          }
        }
      } else if (op < 14) {
        auto N = uniform(rng, 1, 40), T = uniform(rng, 0, 20);
        if (!sim.admit(N, T)) ++rejections;
      } else if (op < 34) {
        auto pre = in_phase(sequence_phase::prefill);
        if (!pre.empty()) {
          auto id = pick(pre, rng);
          auto q  = sim.sequences().at(id.slot);
          sim.chunk(id, uniform(rng, 1, q.prompt_remaining));
        }
      } else if (op < 58) {
        std::vector<sequence_id> batch;
        for (auto id : in_phase(sequence_phase::decode)) {
          auto const& q = sim.sequences().at(id.slot);
          if (q.decoded < q.max_new && rng() % 3 != 0) batch.push_back(id);
        }
        if (rng() % 2 == 0) {
          // A mixed step: some prefill chunks beside the decodes, each batch padded to a random
          // fixed capacity (CUDA-graph style) or not.
          std::vector<sequence_id> pre;
          std::vector<std::int64_t> chunks;
          for (auto id : in_phase(sequence_phase::prefill))
            if (rng() % 2 == 0) {
              pre.push_back(id);
              chunks.push_back(uniform(rng, 1, sim.sequences().at(id.slot).prompt_remaining));
            }
          auto pad = [&](std::size_t n) -> std::size_t {
            auto cap = static_cast<std::size_t>(m.options().max_batch);
            return rng() % 3 == 0 ? 0 : n + rng() % (cap - n + 1);
          };
          std::size_t pp = pad(pre.size()), pd = pad(batch.size());
          padded_requests += static_cast<std::int64_t>((pp == 0 ? 0 : pp - pre.size()) +
                                                       (pd == 0 ? 0 : pd - batch.size()));
          if (!pre.empty() && !batch.empty()) ++mixed_steps;
          sim.mixed_step(pre, chunks, batch, pp, pd);
          if (pd > batch.size() && rng() % 2 == 0) {
            // Misuses of a padded batch, each refused with invalid_argument and no change.
            auto ids    = sim.ids();
            auto before = snapshot(m, ids);
            auto r      = static_cast<std::int32_t>(batch.size());
            REQUIRE_THROWS_WITH(m.batch_sequence(batch_kind::decode, r),
                                Catch::Contains("padding request"));
            std::vector<std::int32_t> counts(pd, 0);
            counts.back() = 1;
            REQUIRE_THROWS_WITH(m.decode_step(counts), Catch::Contains("padding request"));
            auto too_big = static_cast<std::size_t>(m.options().max_batch) + 1;
            REQUIRE_THROWS_WITH(m.set_batch(batch_kind::prefill, batch, too_big),
                                Catch::Contains("set_batch.padded_size"));
            REQUIRE(snapshot(m, ids) == before);
            misuses += 3;
          }
        } else if (!batch.empty()) {
          sim.decode(batch);
        }
      } else if (op < 66) {
        auto dec = in_phase(sequence_phase::decode);
        if (!dec.empty()) sim.end_turn(pick(dec, rng));
      } else if (op < 74) {
        auto ended = in_phase(sequence_phase::ended);
        if (!ended.empty()) {
          if (sim.continue_turn(pick(ended, rng), uniform(rng, 1, 20), uniform(rng, 0, 15)))
            ++continues;
          else
            ++rejections;
        }
      } else if (op < 80) {
        auto cand  = in_phase(sequence_phase::decode);
        auto ended = in_phase(sequence_phase::ended);
        cand.insert(cand.end(), ended.begin(), ended.end());
        if (!cand.empty()) {
          if (sim.fork(pick(cand, rng)))
            ++forks;
          else
            ++rejections;
        }
      } else if (op < 88) {
        auto ids = sim.ids();
        if (!ids.empty()) {
          auto id = pick(ids, rng);
          sim.free(id);
          graveyard.push_back(id);
        }
      } else if (op < 90) {
        auto pre = in_phase(sequence_phase::prefill);
        if (!pre.empty()) {
          auto id = pick(pre, rng);
          sim.abort_mid_chunk(id, uniform(rng, 1, sim.sequences().at(id.slot).prompt_remaining));
          graveyard.push_back(id);
        }
      } else {
        // Misuse; nothing may change.
        int kind = static_cast<int>(rng() % 8);
        auto pre = in_phase(sequence_phase::prefill), dec = in_phase(sequence_phase::decode),
             ended = in_phase(sequence_phase::ended);
        if (kind == 0 && !graveyard.empty()) {
          auto id = pick(graveyard, rng);
          if (!m.contains(id)) misuse([&] { m.free(id); }, "unknown sequence");
        } else if (kind == 1 && !dec.empty()) {
          misuse([&] { m.prepare_chunk(pick(dec, rng), 1); }, "not prefill");
        } else if (kind == 2 && !pre.empty()) {
          misuse(
              [&] {
                m.commit_chunk(pick(pre, rng),
                               std::vector<std::int32_t>(static_cast<std::size_t>(16), 0));
              },
              "no prepared chunk");
        } else if (kind == 3 && !dec.empty()) {
          auto id = pick(dec, rng);
          auto q  = sim.sequences().at(id.slot);
          if (q.decoded == q.max_new) {
            m.set_batch({id});
            misuse([&] { m.decode_step(); }, "past the reservation");
          }
        } else if (kind == 4 && !pre.empty()) {
          misuse([&] { (void)m.continue_turn(pick(pre, rng), 1, 1); }, "end_turn first");
        } else if (kind == 5) {
          misuse([&] { m.end_turn(sequence_id{o.max_sequences + 3, 1}); }, "out of range");
        } else if (kind == 6 && !dec.empty()) {
          auto id = pick(dec, rng);
          if (rng() % 2)
            misuse([&] { m.set_batch({id, id}); }, "listed twice");
          else
            misuse([&] { m.set_batch(batch_kind::prefill, {id, id}, 4); }, "listed twice");
        } else if (kind == 7 && !pre.empty()) {
          misuse([&] { m.end_turn(pick(pre, rng)); }, "phase prefill");
        } else if (!ended.empty() && rng() % 2) {
          misuse([&] { m.prepare_chunk(pick(ended, rng), 1); }, "phase ended");
        } else if (!parking.empty()) {
          auto id = parking[rng() % parking.size()].id;
          if (rng() % 2)
            misuse([&] { (void)m.continue_turn(id, 1, 1); }, "phase parking");
          else
            misuse([&] { (void)m.fork(id); }, "phase parking");
        } else if (!pre.empty()) {
          misuse([&] { (void)m.park(pick(pre, rng)); },
                 "only an ended session or a turn in decode");
        }
        if (!parked.empty() && rng() % 2) {
          // A corrupted session: invalid_argument naming the field, nothing changed.
          auto c = parked[rng() % parked.size()].session;
          c.group_pages[rng() % c.group_pages.size()] += 1;
          auto ids    = sim.ids();
          auto before = snapshot(m, ids);
          REQUIRE_THROWS_AS(m.try_unpark(c, 1, 1), invalid_argument);
          REQUIRE(snapshot(m, ids) == before);
          ++misuses;
        }
      }
      sim.verify();
      ++total_ops;
    }
    for (auto id : sim.ids()) sim.free(id);  // parking ones too: free accepts every phase
    auto ps = m.pool().stats();
    CHECK(ps.used == 0);
    CHECK(ps.reserved == 0);
    CHECK(ps.free == ps.capacity);
    CHECK(m.live_sequences() == 0);
    CHECK(m.stats().reclaimed_pages == 0);
    m.check_invariants();
  }
  INFO("ops " << total_ops << " misuses " << misuses << " forks " << forks << " rejections "
              << rejections);
  CHECK(total_ops == trials * ops);
  // The random walk really exercised the interesting paths.
  CHECK(misuses > 100);
  CHECK(forks > 20);
  CHECK(continues > 20);
  CHECK(rejections > 0);
  INFO("parks " << parks << " cancels " << cancels << " unparks " << unparks << " refusals "
                << unpark_refusals << " forked parks " << shared_parks);
  CHECK(parks > 30);
  CHECK(cancels > 3);
  CHECK(unparks > 20);
  CHECK(shared_parks > 0);
  INFO("running parks " << running_parks << " resumes " << resumes << " refusals "
                        << resume_refusals);
  CHECK(running_parks > 10);
  CHECK(resumes > 5);
  INFO("mixed steps " << mixed_steps << " padding requests " << padded_requests);
  CHECK(mixed_steps > 50);
  CHECK(padded_requests > 100);
}
