# SPDX-License-Identifier: Apache-2.0
"""The manager's lifecycle through the bindings; views alias the manager's memory."""
import gc

import numpy as np
import pytest

import tangram
from conftest import prefill


def test_admission_reserves_exactly_what_admission_pages_says(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=24000, max_sequences=8)
    want = kv.admission_pages(1000, 64)
    seq = kv.try_admit(1000, 64)
    assert kv.info(seq)["reserved_pages"] == want
    assert kv.reserved_pages == want
    assert kv.available_pages == kv.num_pages - want


def test_whole_lifecycle_returns_every_page(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=24000, max_sequences=8)
    seqs = []
    while (s := kv.try_admit(400, 32)) is not None:
        seqs.append(s)
    assert len(seqs) >= 2 and kv.stats["rejected"] == 1
    for s in seqs:
        prefill(kv, s)
        assert kv.info(s)["phase"] == "decode"
    kv.set_batch(seqs)
    for _ in range(32):
        kv.decode_step()
    assert all(kv.info(s)["decoded"] == 32 for s in seqs)
    kv.end_turn(seqs[0])
    for s in seqs[1:]:
        kv.free(s)
    assert kv.continue_turn(seqs[0], 200, 16)
    prefill(kv, seqs[0])
    child = kv.fork(seqs[0])
    assert child is not None and kv.live_sequences == 2
    kv.execute_page_copies()
    assert kv.pending_copies() == []
    kv.free(child)
    kv.free(seqs[0])
    kv.check_invariants()
    assert (kv.used_pages, kv.reserved_pages, kv.live_sequences) == (0, 0, 0)
    assert kv.stats["reclaimed_pages"] == 0


def test_elastic_lifecycle(elastic_plan):
    kv = tangram.KVCacheManager(elastic_plan, num_pages=32000, max_sequences=4, max_chunk_tokens=512)
    seq = kv.try_admit(1000, 32)
    assert seq is not None
    assert kv.elastic_page_limit(seq) > 0
    kv.prepare_chunk(seq, 512)
    # 1000 < the 4128 protected tokens: every compressed head wants all 512 tokens.
    compressed = sum(1 for r in elastic_plan.head_rules if r["kind"] == "compressed")
    assert kv.elastic_wanted_tokens(seq) == 512 * compressed
    kv.commit_chunk(seq, kv.expected_kept(seq, 512))
    prefill(kv, seq)
    kv.set_batch([seq])
    kv.decode_step()
    kv.free(seq)
    kv.check_invariants()
    assert kv.used_pages == 0 and kv.reserved_pages == 0


def test_views_alias_the_managers_memory(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=24000, max_sequences=4)
    seq = kv.try_admit(1000, 16)
    kv.set_batch([seq])
    view = kv.view()
    lengths = view["head_base_len"]
    assert not lengths.flags.writeable and not lengths.flags.owndata
    assert lengths[:4].tolist() == [0, 0, 0, 0]
    prefill(kv, seq)
    # The same array object shows the committed lengths: no copy was made.
    assert lengths[0] == kv.head_len(seq, 0, 0) > 0
    assert view["batch_slots"].tolist() == [seq.slot]
    with pytest.raises(ValueError):
        lengths[0] = 1
    g = int(view["head_group"][0])
    offset = view["page_offset"][seq.slot * kv.num_groups + g]
    assert view["pages"][offset] == kv.group_pages(seq, g)[0]


def test_views_keep_the_manager_alive(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=12000, max_sequences=2)
    seq = kv.try_admit(500, 8)
    prefill(kv, seq)
    pages = kv.view()["pages"]
    first = pages[:8].copy()
    del kv
    gc.collect()
    assert np.array_equal(pages[:8], first)  # still readable: the array owns a reference


def test_dlpack_views_alias_the_same_memory(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=12000, max_sequences=2)
    seq = kv.try_admit(500, 8)
    prefill(kv, seq)
    kv.set_batch([seq])
    numpy_view, dlpack_view = kv.view(), kv.view("dlpack")
    assert numpy_view.keys() == dlpack_view.keys()
    for name, tensor in dlpack_view.items():
        # Both DLPack flavours: legacy (what consumers without versioning ask for; NumPy 2
        # refuses it for a read-only array) and versioned (flagged read-only).
        assert tensor.__dlpack__() is not None and tensor.__dlpack_device__() == (1, 0)
        assert tensor.__dlpack__(max_version=(1, 0)) is not None
        imported = np.from_dlpack(tensor)
        assert not imported.flags.writeable
        assert imported.ctypes.data == numpy_view[name].ctypes.data, name  # no copy
        assert np.array_equal(imported, numpy_view[name]), name
    lengths = np.from_dlpack(dlpack_view["head_base_len"])
    del kv, numpy_view, dlpack_view
    gc.collect()
    assert lengths[0] > 0  # the tensor's owner reference keeps the manager alive


def test_view_framework_is_checked(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=256, max_sequences=1)
    with pytest.raises(ValueError, match="framework must be 'numpy' or 'dlpack', got 'torch'"):
        kv.view("torch")


def test_pool_is_a_writable_alias(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=256, max_sequences=2)
    pool = kv.pool()
    assert pool.shape == (256, static_plan.page_bytes) and pool.dtype == np.uint8
    pool[3, 5] = 42
    assert kv.pool()[3, 5] == 42
    assert pool.__dlpack__() is not None  # DLPack export for other frameworks


def test_admission_says_why(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=12000, max_sequences=1)
    never = kv.admit(200_000, 16)
    assert never["id"] is None and never["reason"] == "never_fits"
    assert never["pages_needed"] == kv.admission_pages(200_000, 16)
    assert never["pages_missing"] == never["pages_needed"] - kv.num_pages
    ok = kv.admit(400, 16)
    assert ok["reason"] == "none" and ok["id"] is not None
    full = kv.admit(400, 16)
    assert full["id"] is None and full["reason"] == "no_free_slot"
    listed = kv.sequences()
    assert [s["id"] for s in listed] == [ok["id"]] and listed[0]["phase"] == "prefill"


def test_extend_speculate_and_roll_back(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=12000, max_sequences=2)
    seq = kv.try_admit(200, 16)
    prefill(kv, seq)
    kv.set_batch([seq])
    reserved = kv.info(seq)["reserved_pages"]
    assert kv.try_extend(seq, 64)  # the turn may now decode 80 tokens
    assert kv.info(seq)["max_new"] == 80 and kv.info(seq)["reserved_pages"] > reserved
    assert not kv.try_extend(seq, 10_000_000)  # does not fit: a return value, nothing changed
    assert kv.info(seq)["max_new"] == 80
    kv.decode_step(np.array([5], dtype=np.int32))  # 5 speculative tokens
    assert kv.info(seq)["decoded"] == 5
    used = kv.used_pages
    kv.rollback(seq, 3)  # 3 rejected
    assert kv.info(seq)["decoded"] == 2 and kv.used_pages <= used
    # The counters C++ manager_stats keeps for these calls (a growth and a refusal, 3 tokens).
    stats = kv.stats
    assert (stats["extended"], stats["extend_rejected"]) == (1, 1)
    assert stats["rolled_back_tokens"] == 3
    assert stats["rollback_pages_returned"] == used - kv.used_pages
    with pytest.raises(tangram.UsageError):
        kv.rollback(seq, kv.max_rollback(seq) + 1)
    kv.append_tokens(seq, 78)
    assert kv.info(seq)["decoded"] == 80
    kv.free(seq)
    kv.check_invariants()
    assert kv.used_pages == 0 and kv.reserved_pages == 0


def test_view_aliases_the_split_map(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=256, max_sequences=1)
    cta = kv.view()["cta_begin"]
    assert not cta.flags.owndata and not cta.flags.writeable
    assert np.array_equal(cta, static_plan.cta_begin.ravel())


def test_flashinfer_layer_lists_each_heads_pages(static_plan):
    plan = static_plan
    H, P, Hp = plan.num_kv_heads, plan.page_tokens, plan.group_size
    kv = tangram.KVCacheManager(plan, num_pages=12000, max_sequences=2)
    seq = kv.try_admit(500, 8)
    prefill(kv, seq)
    kv.set_batch([seq])
    layer = 3
    fl = kv.flashinfer_layer(layer)
    head_group = kv.view()["head_group"]
    assert fl["page_size"] == P and fl["indptr"].tolist()[0] == 0 and len(fl["indptr"]) == H + 1
    for h in range(H):
        # Independent: the group's page list, the head's column, and its length from the manager.
        g, col = head_group[2 * (layer * H + h)], head_group[2 * (layer * H + h) + 1]
        n = kv.head_len(seq, layer, h)
        pages = -(-n // P)
        got = fl["indices"][fl["indptr"][h]:fl["indptr"][h + 1]].tolist()
        assert got == [p * 2 * Hp + col for p in kv.group_pages(seq, int(g))[:pages]]
        assert fl["last_page_len"][h] == n - (pages - 1) * P
    with pytest.raises(ValueError, match="layer"):
        kv.flashinfer_layer(plan.num_layers)


def test_commit_chunk_never_converts_arrays(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=12000, max_sequences=1)
    seq = kv.try_admit(24, 4)
    kv.prepare_chunk(seq, 24)
    kept = kv.expected_kept(seq, 24)
    for wrong in (np.array(kept, np.int64), np.array(kept, np.uint32), np.array(kept, np.float64)):
        with pytest.raises(TypeError):
            kv.commit_chunk(seq, wrong)
    kv.check_invariants()
    kv.commit_chunk(seq, kept)  # a list of ints is fine
    assert kv.info(seq)["phase"] == "decode"


def test_files_take_pathlike(tmp_path, static_plan):
    samples = tangram.load_retention_samples(tangram.profile_path("snapkv/llama-3.1-8b-instruct"))
    assert len(samples.contexts) > 0
    tangram.save_plan(static_plan, tmp_path / "plan.json")
    assert tangram.load_plan(tmp_path / "plan.json").page_bytes == static_plan.page_bytes


def decoded_with_random_pool(plan, steps, seed):
    """A manager whose one sequence (400 prompt tokens, 8 answer tokens) has decoded `steps`
    tokens, its pool filled with random stand-in K/V bytes: (kv, seq, pool)."""
    kv = tangram.KVCacheManager(plan, num_pages=16000, max_sequences=2)
    seq = kv.try_admit(400, 8)
    prefill(kv, seq)
    kv.set_batch([seq])
    for _ in range(steps):
        kv.decode_step()
    pool = kv.pool()
    pool[:] = np.random.default_rng(seed).integers(0, 256, pool.shape, dtype=np.uint8)
    return kv, seq, pool


def test_park_in_host_memory_and_restore(static_plan):
    L, H = static_plan.num_layers, static_plan.num_kv_heads
    kv, seq, pool = decoded_with_random_pool(static_plan, 8, seed=2)
    kv.end_turn(seq)
    lengths = [kv.head_len(seq, l, h) for l in range(L) for h in range(H)]
    held = kv.used_pages

    parked = kv.park(seq)
    assert kv.info(seq)["phase"] == "parking" and parked.host_pages == len(parked.device_pages)
    host = pool[parked.device_pages].copy()  # the engine's copy-out
    with pytest.raises(tangram.UsageError):
        kv.decode_step()  # a parking sequence takes no other call
    kv.complete_park(seq)
    assert kv.used_pages == held - parked.host_pages and kv.live_sequences == 0
    assert not kv.contains(seq)

    need = kv.unpark_pages(parked, 100, 8)
    restored = kv.try_unpark(parked, 100, 8)
    assert restored is not None
    new_seq, pages = restored
    assert kv.reserved_pages + kv.used_pages >= need and len(pages) == parked.host_pages
    pool[pages] = host  # the engine's copy-in, before any kernel reads the sequence
    assert [kv.head_len(new_seq, l, h) for l in range(L) for h in range(H)] == lengths
    assert kv.info(new_seq)["phase"] == "prefill" and kv.info(new_seq)["prompt_remaining"] == 100
    assert kv.stats["parked"] == 1 and kv.stats["unparked"] == 1
    kv.free(new_seq)
    kv.check_invariants()
    assert kv.used_pages == 0 and kv.reserved_pages == 0

    other = tangram.KVCacheManager(static_plan, num_pages=parked.host_pages, max_sequences=1)
    assert other.try_unpark(parked, 100, 8) is None  # does not fit: a value, nothing changed
    other.check_invariants()


def test_park_a_running_turn_and_resume_it(static_plan):
    """A turn in decode parks (an answer's growth that did not fit) and resumes where it stopped:
    the C++ try_resume through the bindings, with the same checks as park / try_unpark."""
    L, H = static_plan.num_layers, static_plan.num_kv_heads
    kv, seq, pool = decoded_with_random_pool(static_plan, 3, seed=5)
    lengths = [kv.head_len(seq, l, h) for l in range(L) for h in range(H)]
    parked = kv.park(seq)
    assert parked.mid_turn and parked.decoded == 3 and parked.max_new == 8
    host = pool[parked.device_pages].copy()
    kv.complete_park(seq)
    assert kv.used_pages == 0 and kv.reserved_pages == 0  # pages and reservation back
    with pytest.raises(ValueError, match="try_unpark.session.mid_turn"):
        kv.try_unpark(parked, 1, 1)
    with pytest.raises(ValueError, match="try_resume.max_new_tokens"):
        kv.try_resume(parked, 2)  # below the 3 tokens it decoded
    need = kv.resume_pages(parked, 8)
    new_seq, pages = kv.try_resume(parked, 8)
    pool[pages] = host
    assert np.array_equal(pool[pages], host)
    assert kv.used_pages + kv.reserved_pages == need
    info = kv.info(new_seq)
    assert info["phase"] == "decode" and info["decoded"] == 3 and info["max_new"] == 8
    assert [kv.head_len(new_seq, l, h) for l in range(L) for h in range(H)] == lengths
    kv.set_batch([new_seq])
    for _ in range(5):
        kv.decode_step()
    assert kv.info(new_seq)["reserved_pages"] == 0
    assert kv.stats["parked_mid_turn"] == 1 and kv.stats["resumed"] == 1
    kv.end_turn(new_seq)
    kv.free(new_seq)
    kv.check_invariants()


def test_answer_window_mirrors_the_cpp_policy(static_plan):
    w = tangram.AnswerWindow()
    assert (w.window_tokens, w.victims, w.host_pool_ratio) == (256, "idle_then_newest", 2.0)
    assert w.first(4096) == 256 and w.first(100) == 100
    assert w.growth(4096, 256) == 256 and w.growth(300, 256) == 44 and w.growth(256, 256) == 0
    assert w.host_limit_bytes(1000) == 2000
    kv = tangram.KVCacheManager(static_plan, num_pages=16000, max_sequences=3)
    ids = [kv.try_admit(10, 1) for _ in range(3)]  # the ids only name the candidates
    # (SequenceId, phase, last_used, pages)
    candidates = [(ids[0], "decode", 5, 10), (ids[1], "ended", 9, 4), (ids[2], "ended", 2, 8)]
    assert w.choose_victim(candidates, 1, 10**9) == 2      # the least recently used ended one
    assert w.choose_victim(candidates[:1], 1, 10**9) == 0  # then the running turn
    assert w.choose_victim(candidates, 1, 4) == 1          # only what fits host memory
    assert w.choose_victim(candidates, 1, 3) is None
    assert tangram.AnswerWindow(victims="largest").choose_victim(candidates, 1, 10**9) == 0
    with pytest.raises(ValueError, match="answer_window_options.window_tokens"):
        tangram.AnswerWindow(window_tokens=-1)
    with pytest.raises(ValueError, match="answer_window_options.victims"):
        tangram.AnswerWindow(victims="oldest")
    with pytest.raises(ValueError, match="unknown phase 'sleeping'"):
        w.choose_victim([(ids[0], "sleeping", 0, 0)], 1, 1)


def test_shared_prefix_lifecycle(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=24000, max_sequences=8)
    p = kv.try_admit(600, 1)
    prefill(kv, p)
    kv.set_batch([p])
    kv.decode_step()
    kv.end_turn(p)
    with pytest.raises(ValueError, match="prefix"):
        kv.try_admit_with_prefix(p, 100, 16)  # not pinned yet
    prefix_used = kv.used_pages
    assert not kv.info(p)["pinned"]
    kv.pin_prefix(p)
    assert kv.info(p)["pinned"] and kv.info(p)["phase"] == "ended"
    with pytest.raises(tangram.UsageError, match="pinned prefix"):
        kv.continue_turn(p, 10, 1)
    a = kv.try_admit_with_prefix(p, 100, 16)
    assert a is not None and kv.stats["prefix_admits"] == 1
    # Reserved: the same tokens admitted alone, less the pages it starts with.
    assert kv.info(a)["reserved_pages"] < kv.admission_pages(701, 16)
    # The pool counts a shared page once: beyond the prefix, the request holds only its copies.
    assert kv.used_pages == prefix_used + len(kv.pending_copies())
    # Static budgets: compressed groups share their filled prefix pages too, pinned in place
    # (the view's pinned_tokens row, a whole number of pages, what the eviction never moves).
    P = static_plan.page_tokens
    pinned = [kv.group_pinned_tokens(a, g) for g in range(kv.num_groups)]
    assert any(t > 0 for t in pinned) and all(t % P == 0 for t in pinned)
    row = kv.view()["pinned_tokens"][a.slot * kv.num_groups:(a.slot + 1) * kv.num_groups]
    assert list(row) == pinned
    assert kv.stats["prefix_pages_shared"] == sum(pinned) // P
    for g, t in enumerate(pinned):  # the pinned pages are the prefix's own
        assert kv.group_pages(a, g)[: t // P] == kv.group_pages(p, g)[: t // P]
    kv.execute_page_copies()
    prefill(kv, a)
    kv.set_batch([a])
    for _ in range(16):
        kv.decode_step()
    kv.free(a)
    assert kv.used_pages == prefix_used  # the pinned prefix outlives its requests
    kv.free(p)
    kv.check_invariants()
    assert (kv.used_pages, kv.reserved_pages, kv.live_sequences) == (0, 0, 0)
    assert kv.stats["reclaimed_pages"] == 0
