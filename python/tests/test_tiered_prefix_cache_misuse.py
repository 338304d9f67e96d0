"""TieredPrefixCache misuse through Python, on a GPU (the `torch` fixture: skipped without a GPU or torch, failed under
KVCACHE_REQUIRE_GPU=1): construction refused naming the field, a PageManager served by a tiered cache refusing what
would bypass it, lent host tiers refusing writes to the tiered cache's host pages, the objects each keeps alive, and
bad arguments refused before anything changes (counters, pages, the device's and the host's bytes)."""

import gc
import weakref

import pytest

import kvcache
from test_gpu import fill_distinct, pools_of
from test_tiered_prefix_cache import MIXED, P, SEQ, STEP, WINDOWED, Tiered, make_config, stats_of, token_run


def test_construction_is_checked_and_a_served_manager_refuses_what_would_bypass_the_tiered_cache(torch, tmp_path):
    stream = torch.cuda.current_stream()
    cache = kvcache.KVCacheManager(make_config(MIXED), stream)
    before = fill_distinct(torch, pools_of(torch, cache))
    larger = kvcache.PageManager(make_config(MIXED, num_pages=24), max_sequences=4)
    with pytest.raises(kvcache.InvalidArgumentError, match="group 0 numPages is 24 in the manager and 16 in the cache"):
        kvcache.TieredPrefixCache(cache, larger, [8])
    pages = kvcache.PageManager(cache, max_sequences=4)
    evicted = []
    pages.set_eviction_callback(lambda group, page, page_hash: evicted.append(page))
    refusals = [
        (kvcache.InvalidArgumentError, "numHostPages has 0 entries", []),
        (kvcache.InvalidArgumentError, "numHostPages has 2 entries", [8, 8]),
        (kvcache.InvalidArgumentError, r"numHostPages\[0\] is 0; it must be in \[1, 2147483647\]", [0]),
        (kvcache.InvalidArgumentError, r"numHostPages\[0\] is 2147483648", [2**31]),
        (TypeError, "num_host_pages is a int", 8),
        (TypeError, r"num_host_pages\[0\] is a str", ["8"]),
    ]
    for error, pattern, num_host_pages in refusals:
        with pytest.raises(error, match=pattern):
            kvcache.TieredPrefixCache(cache, pages, num_host_pages)
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    disk_refusals = [
        (kvcache.InvalidArgumentError, "numDiskPages has 0 entries; a disk tier needs both",
         dict(disk_directory=tmp_path)),
        (kvcache.InvalidArgumentError, "diskDirectory is '' and numDiskPages has 1 entries", dict(num_disk_pages=[8])),
        (kvcache.InvalidArgumentError, r"numDiskPages\[0\] is 0; it must be in \[1, 2147483647\]",
         dict(disk_directory=tmp_path, num_disk_pages=[0])),
        (kvcache.InvalidArgumentError, "numDiskPages has 2 entries",
         dict(disk_directory=tmp_path, num_disk_pages=[8, 8])),
        (kvcache.InvalidArgumentError, "is not a directory and cannot be made one",
         dict(disk_directory=a_file, num_disk_pages=[8])),
        (TypeError, "disk_directory is a int", dict(disk_directory=5, num_disk_pages=[8])),
        (kvcache.InvalidArgumentError, r"minOffloadPriority is 101; it must be in \[0, 100\]",
         dict(min_offload_priority=101)),
        (kvcache.InvalidArgumentError, r"minOffloadPriority is -1", dict(min_offload_priority=-1)),
        (TypeError, r"num_disk_pages\[0\] is a str", dict(disk_directory=tmp_path, num_disk_pages=["8"])),
    ]
    for error, pattern, disk in disk_refusals:
        with pytest.raises(error, match=pattern):
            kvcache.TieredPrefixCache(cache, pages, [8], **disk)
    with pytest.raises(TypeError, match="pages is a Config; expected a PageManager"):
        kvcache.TieredPrefixCache(cache, make_config(MIXED), [8])
    # The manager's own callback is still the one called.
    tokens = token_run(1, P)
    sequence = pages.create()
    pages.append(sequence, tokens)
    pages.free(sequence)
    assert pages.evict_cached(0, 4) == 1 and len(evicted) == 1

    tiered = kvcache.TieredPrefixCache(cache, pages, [8])
    assert tiered.num_groups() == 1 and tiered.host_tier(0).num_host_pages() == 8
    lent = tiered.host_tier(0)
    assert (lent.group(), lent.geometry()) == (0, kvcache.page_geometry(cache.layout(), 0))
    del lent
    with pytest.raises(kvcache.OutOfRangeError, match=r"TieredPrefixCache::hostTier: group is 1; groups are \[0, 1\)"):
        tiered.host_tier(1)
    with pytest.raises(kvcache.OutOfRangeError, match="TieredPrefixCache::findHostPage: group is -1"):
        tiered.find_host_page(-1, (0, 0))
    assert tiered.find_host_page(0, (0, 0)) == -1
    # While it serves the manager, the manager refuses what would bypass it, and a second tiered cache.
    sequence = pages.create()
    served = [
        ("PageManager.step: a TieredPrefixCache serves this manager", lambda: pages.step([(sequence, tokens)])),
        ("PageManager.append: a TieredPrefixCache serves this manager", lambda: pages.append(sequence, tokens)),
        ("PageManager.set_eviction_callback: a TieredPrefixCache", lambda: pages.set_eviction_callback(print)),
        ("pages is served by another TieredPrefixCache", lambda: kvcache.TieredPrefixCache(cache, pages, [8])),
    ]
    for pattern, call in served:
        with pytest.raises(kvcache.InvalidArgumentError, match=pattern):
            call()
    assert pages.length(sequence) == 0
    # Its evictions reach the tiered cache, not the manager's old callback.
    hashes = pages.hash_next_pages(sequence, tokens)
    assert tiered.step([(sequence, tokens)], stream) == [[]]
    page = pages.pages(sequence, 0)[0][0]
    pages.free(sequence)
    assert tiered.evict_cached(0, 4, stream) == 1
    assert len(evicted) == 1
    assert (tiered.stats().offloaded_pages, tiered.num_host_pages_held(0)) == (1, 1)
    host_page = tiered.find_host_page(0, hashes[0])
    assert host_page >= 0
    parts = [before[layer][half, page].reshape(-1).view(torch.uint8)
             for layer in cache.group(0).layers for half in range(before[layer].shape[0])]
    assert torch.equal(torch.from_dlpack(tiered.host_tier(0).host_page_view(host_page)), torch.cat(parts).cpu())
    tiered.check_invariants()

    # Once it is gone the manager is its own again (without a callback: the tiered cache cleared it).
    del tiered
    gc.collect()
    sequence = pages.create()
    pages.step([(sequence, token_run(500, P))])
    pages.free(sequence)
    assert pages.evict_cached(0, 4) == 1 and len(evicted) == 1
    pages.set_eviction_callback(lambda group, page, page_hash: evicted.append(page))
    pages.check_invariants()


def test_the_tiered_cache_keeps_its_cache_and_manager_alive_and_a_lent_tier_keeps_it(torch):
    cache = kvcache.KVCacheManager(make_config(MIXED), torch.cuda.current_stream())
    pages = kvcache.PageManager(cache, max_sequences=4)
    tiered = kvcache.TieredPrefixCache(cache, pages, [4])
    cache_alive, pages_alive, tiered_alive = weakref.ref(cache), weakref.ref(pages), weakref.ref(tiered)
    del cache, pages
    gc.collect()
    assert cache_alive() is not None and pages_alive() is not None
    sequence = pages_alive().create()
    assert tiered.admit(sequence, token_run(1, 2 * P)).compute_tokens == 2 * P
    tier = tiered.host_tier(0)
    del tiered
    gc.collect()
    assert tiered_alive() is not None  # the lent tier keeps it
    view = tier.host_page_view(0)
    del tier
    gc.collect()
    assert tiered_alive() is not None  # the view keeps the tier
    del view
    gc.collect()
    assert tiered_alive() is None and pages_alive() is None and cache_alive() is None


def test_misuse_raises_named_errors_and_changes_nothing(torch, tmp_path):
    s = Tiered(torch, WINDOWED, kvcache.DataType.FLOAT16, [16, 16])
    prompt = token_run(7, 5 * P + 3)
    donor = s.pages.create()
    s.tiered.admit(donor, prompt)
    s.prefill(donor, prompt)
    s.pages.free(donor)
    s.tiered.evict_cached(0, 64)
    s.tiered.evict_cached(1, 64)
    busy = s.pages.create()
    s.tiered.admit(busy, token_run(5000, 20))
    s.prefill(busy, token_run(5000, 20))
    gone = s.pages.create()
    s.pages.free(gone)
    request = s.pages.create()
    torch.cuda.synchronize()
    pools = [pool.view(torch.int16).clone() for pool in s.pools]
    host = [[s.host_bytes(group, host_page) for host_page in range(16)] for group in range(2)]
    stats = stats_of(s.tiered)
    held = [s.tiered.num_host_pages_held(group) for group in range(2)]
    counts = [(c.free, c.used, c.cached) for c in (s.pages.counts(group) for group in range(2))]
    tier = s.tiered.host_tier(0)
    lent = "the tier belongs to a TieredPrefixCache"
    refusals = [
        (kvcache.InvalidArgumentError, r"PageManager::adoptPrefix: sequence \d+ is unknown",
         lambda: s.tiered.admit(gone, prompt)),
        (kvcache.InvalidArgumentError, "has 20 tokens; it must be empty", lambda: s.tiered.admit(busy, prompt)),
        (kvcache.InvalidArgumentError, r"count is 129; it must be in \[0, 128\]",
         lambda: s.tiered.admit(request, token_run(1, SEQ + 1))),
        (kvcache.InvalidArgumentError, "extra keys must be sorted by position",
         lambda: s.tiered.admit(request, prompt, None, [(20, 1, 2), (3, 1, 2)])),
        (TypeError, r"extra_keys\[0\] is a str", lambda: s.tiered.admit(request, prompt, extra_keys=["key"])),
        (TypeError, "tokens is a int", lambda: s.tiered.admit(request, 5)),
        (TypeError, "stream is a str", lambda: s.tiered.admit(request, prompt, "stream")),
        (kvcache.InvalidArgumentError, r"appends\[0\]\.count is 33; it must be in \[0, 32\]",
         lambda: s.tiered.step([(request, token_run(1, STEP + 1))])),
        (kvcache.InvalidArgumentError, "is unknown", lambda: s.tiered.step([(request, [1]), (gone, [1])])),
        (TypeError, r"appends\[0\] is a int", lambda: s.tiered.step([5])),
        (TypeError, "stream is a str", lambda: s.tiered.step([(request, [1])], "stream")),
        (kvcache.OutOfRangeError, "group 2 is out of range", lambda: s.tiered.evict_cached(2, 1)),
        (kvcache.InvalidArgumentError, "count is -1; it must be >= 0", lambda: s.tiered.evict_cached(0, -1)),
        (kvcache.InvalidArgumentError, "group is 4294967296", lambda: s.tiered.evict_cached(2**32, 1)),
        (kvcache.OutOfRangeError, r"TieredPrefixCache::hostTier: group is 2; groups are \[0, 2\)",
         lambda: s.tiered.host_tier(2)),
        (kvcache.OutOfRangeError, "TieredPrefixCache::numHostPagesHeld: group is -1",
         lambda: s.tiered.num_host_pages_held(-1)),
        (kvcache.OutOfRangeError, "TieredPrefixCache::findHostPage: group is 2",
         lambda: s.tiered.find_host_page(2, (0, 0))),
        (TypeError, "hash is a str", lambda: s.tiered.find_host_page(0, "hash")),
        (TypeError, "hash is a tuple", lambda: s.tiered.find_host_page(0, (-1, 0))),
        (kvcache.InvalidArgumentError, f"HostTier.allocate_host_pages: {lent}", lambda: tier.allocate_host_pages(1)),
        (kvcache.InvalidArgumentError, f"HostTier.release_host_pages: {lent}", lambda: tier.release_host_pages([0])),
        (kvcache.InvalidArgumentError, f"HostTier.offload: {lent}", lambda: tier.offload([(0, 0)])),
        (kvcache.InvalidArgumentError, f"load_sequence: {lent}",
         lambda: kvcache.load_sequence(tmp_path / "absent.kvseq", tier, [0])),
        (kvcache.InvalidArgumentError, "PageManager.step: a TieredPrefixCache", lambda: s.pages.step([(request, [1])])),
        (kvcache.InvalidArgumentError, "PageManager.append: a TieredPrefixCache", lambda: s.pages.append(request, [1])),
        (kvcache.InvalidArgumentError, "PageManager.set_eviction_callback: a TieredPrefixCache",
         lambda: s.pages.set_eviction_callback(None)),
        (kvcache.InvalidArgumentError, "pages is served by another TieredPrefixCache",
         lambda: kvcache.TieredPrefixCache(s.cache, s.pages, [16, 16])),
    ]
    for error, pattern, call in refusals:
        with pytest.raises(error, match=pattern):
            call()

    torch.cuda.synchronize()
    assert stats_of(s.tiered) == stats
    assert [s.tiered.num_host_pages_held(group) for group in range(2)] == held
    assert [(c.free, c.used, c.cached) for c in (s.pages.counts(group) for group in range(2))] == counts
    assert (s.pages.length(busy), s.pages.length(request)) == (20, 0)
    for layer, (pool, old) in enumerate(zip(s.pools, pools)):
        assert torch.equal(pool.view(torch.int16), old), f"layer {layer}"
    for group in range(2):
        for host_page in range(16):
            assert torch.equal(s.host_bytes(group, host_page), host[group][host_page]), (group, host_page)
    s.tiered.check_invariants()
    s.pages.check_invariants()
    # Everything still works: the host's pages come back.
    assert s.tiered.admit(request, prompt).host_tokens == 5 * P
