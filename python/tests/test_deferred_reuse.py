# SPDX-License-Identifier: Apache-2.0
"""Deferred page reuse through the bindings: freed pages wait for their epoch's release."""
import numpy as np
import pytest

import tangram
from conftest import prefill


def test_freed_pages_wait_for_the_release_of_their_epoch(static_plan):
    need = tangram.KVCacheManager(static_plan, num_pages=24000).admission_pages(1000, 64)
    pages = need + need // 4  # room for one such request, not for two
    kv = tangram.KVCacheManager(static_plan, num_pages=pages, max_sequences=4, deferred_reuse=True)
    assert kv.current_epoch == 0 and kv.released_epoch == -1
    seq = kv.try_admit(1000, 64)
    prefill(kv, seq)
    used = kv.used_pages
    assert used > 0
    kv.free(seq)
    assert kv.retired_pages == used and kv.used_pages == 0
    assert kv.available_pages == kv.num_pages - used
    # A request that needs them waits: the reason says so, with the counts.
    assert need > kv.available_pages
    r = kv.admit(1000, 64)
    assert r["id"] is None
    assert r["reason"] == "pages_awaiting_release"
    assert r["pages_retired"] == used
    assert r["pages_missing"] == need - kv.available_pages
    assert 0 < r["pages_missing"] <= used
    assert kv.advance_epoch() == 0
    with pytest.raises(ValueError, match="release_epochs_through.epoch: 1 is not closed yet"):
        kv.release_epochs_through(1)
    assert kv.release_epochs_through(0) == used
    assert kv.retired_pages == 0 and kv.released_epoch == 0
    assert kv.available_pages == kv.num_pages
    assert kv.stats["spare_pages_kept"] == 0
    kv.check_invariants()


def test_without_deferred_reuse_pages_free_at_once(static_plan):
    kv = tangram.KVCacheManager(static_plan, num_pages=12000, max_sequences=4)
    seq = kv.try_admit(500, 16)
    prefill(kv, seq)
    kv.free(seq)
    assert kv.retired_pages == 0 and kv.available_pages == kv.num_pages
    r = kv.admit(500, 16)
    assert r["reason"] == "none" and r["pages_retired"] == 0


def test_elastic_reservation_with_deferred_reuse(elastic_plan):
    kv = tangram.KVCacheManager(elastic_plan, num_pages=32000, max_sequences=4,
                                max_chunk_tokens=512, deferred_reuse=True)
    seq = kv.try_admit(1000, 32)
    assert seq is not None
    prefill(kv, seq)
    kv.set_batch([seq])
    for _ in range(8):
        kv.decode_step()
    kv.rollback(seq, 3)
    kv.end_turn(seq)
    kv.free(seq)
    assert kv.used_pages == 0 and kv.reserved_pages == 0
    assert kv.retired_pages > 0
    kv.release_epochs_through(kv.advance_epoch())
    assert kv.retired_pages == 0 and kv.available_pages == kv.num_pages
    kv.check_invariants()
