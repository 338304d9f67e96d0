"""PageManager through Python: the documented page lifecycle rules (pages per sequence, fork and copy-on-write, prefix
reuse of whole pages, all-or-nothing steps), counted by hand. No GPU."""

import gc
import weakref

import pytest

import kvcache

P = 4  # tokens per page


def make_manager(num_pages=0, **options):
    config = kvcache.Config(layer_configs=[(1, 8)], max_batch_size=4, max_sequence_length=64, tokens_per_page=P,
                            num_pages=num_pages, max_tokens_per_step=64)
    return kvcache.PageManager(config, **options)


def test_append_fork_and_copy_on_write():
    manager = make_manager()
    parent = manager.create()
    manager.append(parent, list(range(1, 11)))  # 10 tokens: 2 full pages and 2 tokens in a third
    parent_pages, length = manager.pages(parent, 0)
    assert length == 10 and len(parent_pages) == 3 and len(set(parent_pages)) == 3
    assert manager.counts(0).used == 3

    child = manager.fork(parent)
    assert manager.pages(child, 0) == (parent_pages, 10)
    assert manager.counts(0).shared == 3
    copies = manager.step([(child, [99])])  # the child writes into the shared partial page: it moves to a copy
    child_pages, child_length = manager.pages(child, 0)
    assert child_length == 11
    assert child_pages[:2] == parent_pages[:2] and child_pages[2] not in parent_pages
    assert copies == [[(parent_pages[2], child_pages[2])]]
    assert manager.last_copies() == copies
    assert manager.stats().copy_on_write_pages == 1
    assert manager.append(parent, [98]) == [[]]  # the parent is now the page's only holder: it writes in place
    manager.check_invariants()


def test_a_later_prompt_adopts_whole_cached_pages():
    manager = make_manager(hash_algorithm=kvcache.PageHashAlgorithm.XXH3_128, hash_seed=bytes(range(32)))
    first = manager.create()
    prompt = list(range(100, 110))
    manager.append(first, prompt)
    first_pages, _ = manager.pages(first, 0)
    manager.free(first)
    assert manager.counts(0).cached == 2  # the two full pages were registered; the partial one is free
    second = manager.create()
    assert manager.adopt_prefix(second, prompt) == 2 * P  # whole pages, at most len(prompt) - 1 tokens
    assert manager.pages(second, 0) == (first_pages[:2], 2 * P)
    other = manager.create(salt=b"tenant-b")
    assert manager.adopt_prefix(other, prompt) == 0  # another salt shares nothing
    stats = manager.stats()
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (2 * len(prompt), 2 * P)


def test_hash_next_pages_names_what_eviction_reports_and_append_registers():
    manager = make_manager(hash_algorithm=kvcache.PageHashAlgorithm.XXH3_128, hash_seed=bytes(range(32)))
    evicted = []
    manager.set_eviction_callback(lambda group, page, page_hash: evicted.append(page_hash))
    prompt = list(range(300, 311))  # two full pages and three tokens
    donor = manager.create()
    hashes = manager.hash_next_pages(donor, prompt)
    assert len(hashes) == 2 and hashes[0] != hashes[1]
    manager.append(donor, prompt)
    manager.free(donor)
    assert manager.evict_cached(0, 2) == 2
    assert sorted(evicted) == sorted(hashes)
    request = manager.create()
    assert manager.adopt_prefix(request, prompt) == 0
    assert manager.hash_next_pages(request, prompt) == hashes  # found elsewhere: append, then onboard
    manager.append(request, prompt[: 2 * P])
    manager.free(request)
    assert manager.adopt_prefix(manager.create(), prompt) == 2 * P
    partial = manager.create()
    manager.append(partial, [1])
    with pytest.raises(ValueError):
        manager.hash_next_pages(partial, prompt)


def test_a_step_that_does_not_fit_changes_nothing():
    manager = make_manager(max_sequences=5)
    full = [manager.create() for _ in range(4)]
    manager.step([(s, list(range(64))) for s in full])  # 16 pages each: all 64 pages in use
    assert manager.counts(0).free == 0
    late = manager.create()
    before = [manager.pages(s, 0) for s in full]
    assert manager.pages_needed([(late, [1])]) == [1]
    assert not manager.can_step([(late, [1])])
    assert manager.can_step([(late, [])])
    with pytest.raises(kvcache.OutOfMemoryError):
        manager.step([(late, [1])])
    assert manager.length(late) == 0
    assert [manager.pages(s, 0) for s in full] == before
    manager.check_invariants()


def test_bad_arguments_raise_the_documented_errors():
    manager = make_manager()
    with pytest.raises(ValueError):
        manager.length(12345)
    sequence = manager.create()
    with pytest.raises(IndexError):
        manager.pages(sequence, 1)
    with pytest.raises(ValueError):
        manager.step([(sequence, [1]), (sequence, [2])])  # listed twice
    assert manager.length(sequence) == 0
    with pytest.raises(ValueError, match="hash_seed has 3 bytes"):
        make_manager(hash_seed=b"abc")


def test_pages_needed_and_can_step_change_nothing_and_agree_with_step():
    manager = make_manager()
    a = manager.create()
    manager.append(a, list(range(6)))  # pages: one full, one with 2 tokens
    b = manager.fork(a)
    appends = [(a, [1, 2, 3]), (b, [4])]  # a: copy and one new page; b: then the only holder, in place
    assert manager.pages_needed(appends) == [2]
    assert manager.can_step(appends)
    free = manager.counts(0).free
    assert free == 64 - 2 and manager.length(a) == 6 and manager.length(b) == 6
    manager.step(appends)
    assert manager.counts(0).free == free - 2
    with pytest.raises(ValueError):
        manager.can_step([(a, [1]), (a, [2])])  # invalid input still raises


def test_built_from_a_layout():
    config = kvcache.Config(layer_configs=[(1, 8)], max_batch_size=2, max_sequence_length=32, tokens_per_page=P)
    manager = kvcache.PageManager(kvcache.compute_layout(config))
    assert manager.layout().num_pages == kvcache.compute_layout(config).num_pages
    sequence = manager.create()
    manager.append(sequence, list(range(5)))
    assert manager.pages(sequence, 0) == ([0, 1], 5)
    with pytest.raises(ValueError, match="source"):
        kvcache.PageManager(42)


def fill_with_cached_pages(manager):
    """Leaves every page of group 0 cached (4 freed sequences of 16 full pages, distinct tokens): the next page taken
    is an eviction."""
    for i in range(4):
        sequence = manager.create()
        manager.append(sequence, [1000 * i + t for t in range(16 * P)])
        manager.free(sequence)
    counts = manager.counts(0)
    assert (counts.free, counts.cached) == (0, 64)


def test_set_eviction_callback_none_removes_the_callback():
    manager = make_manager()
    evicted = []
    manager.set_eviction_callback(lambda group, page, page_hash: evicted.append(page))
    fill_with_cached_pages(manager)
    assert manager.evict_cached(0, 1) == 1 and len(evicted) == 1
    manager.set_eviction_callback(None)
    assert manager.evict_cached(0, 2) == 2
    assert len(evicted) == 1  # not called any more
    assert manager.stats().evicted_pages == 3
    with pytest.raises(TypeError, match="callback is a int; expected a callable or None"):
        manager.set_eviction_callback(3)
    manager.check_invariants()


class EvictionRefused(Exception):
    pass


def test_a_raising_eviction_callback_leaves_the_manager_consistent():
    manager = make_manager()
    calls = []

    def refuse(group, page, page_hash):
        calls.append(page)
        raise EvictionRefused(f"page {page}")

    manager.set_eviction_callback(refuse)
    fill_with_cached_pages(manager)
    held = []
    for round in range(1, 4):
        sequence = manager.create()
        held.append(sequence)
        tokens = [5000 + 100 * round + t for t in range(2 * P)]  # two new pages, each an eviction that raises
        with pytest.raises(EvictionRefused) as error:
            manager.append(sequence, tokens)
        assert str(error.value) == f"page {calls[-2]}"  # the first exception of the call comes through
        manager.check_invariants()
        assert manager.length(sequence) == 2 * P  # the step completed
        assert len(manager.last_copies()) == 1
        assert len(calls) == 2 * round
        counts = manager.counts(0)
        assert (counts.used, counts.cached, counts.free) == (2 * round, 64 - 2 * round, 0)
        assert manager.stats().evicted_pages == 2 * round
        assert sorted(manager.pages(sequence, 0)[0]) == sorted(calls[-2:])  # it holds the pages evicted for it
    with pytest.raises(EvictionRefused):
        manager.evict_cached(0, 3)  # every page dropped though the callback raised for each
    manager.check_invariants()
    counts = manager.counts(0)
    assert (counts.used, counts.cached, counts.free) == (6, 64 - 6 - 3, 3)
    assert len(calls) == 9 and manager.stats().evicted_pages == 9


def manager_in_a_cycle_with_its_callback():
    """Returns a weak reference to a manager whose callback (a closure) refers to the manager."""
    manager = make_manager()
    calls = []
    manager.set_eviction_callback(lambda group, page, page_hash: calls.append(manager.counts(group).free))
    fill_with_cached_pages(manager)
    assert manager.evict_cached(0, 1) == 1 and calls == [1]  # called with the page already free
    return weakref.ref(manager)


class Tier:
    """Holds a manager whose callback is one of its own bound methods."""

    def __init__(self):
        self.manager = make_manager()
        self.manager.set_eviction_callback(self.on_evict)

    def on_evict(self, group, page, page_hash):
        pass


def test_an_eviction_callback_that_refers_to_its_manager_is_collected():
    gc.collect()
    closure = manager_in_a_cycle_with_its_callback()
    tier = Tier()
    bound = weakref.ref(tier.manager)
    del tier
    gc.collect()
    assert closure() is None
    assert bound() is None


def test_wrong_argument_types_raise_type_error_naming_the_argument():
    manager = make_manager()
    with pytest.raises(TypeError, match="salt is a str; expected bytes or None"):
        manager.create(salt="x")
    with pytest.raises(TypeError, match="hash_seed is a bytearray; expected 32 bytes or None"):
        make_manager(hash_seed=bytearray(32))
    sequence = manager.create()
    with pytest.raises(TypeError, match=r"appends\[0\] sequence is a str; expected an int"):
        manager.step([("s", [1])])
    with pytest.raises(TypeError, match=r"appends\[1\] is a int; expected a \(sequence, tokens"):
        manager.step([(sequence, [1]), 5])
    with pytest.raises(TypeError, match="appends is a int"):
        manager.can_step(5)
    with pytest.raises(TypeError, match=r"tokens\[1\] is a str; token ids must be ints"):
        manager.append(sequence, [1, "2"])
    with pytest.raises(TypeError, match=r"extra_keys\[0\] is a str; expected a \(position, lo, hi\)"):
        manager.append(sequence, [1], ["key"])
    with pytest.raises(TypeError, match="extra_keys is a int"):
        manager.append(sequence, [1], 7)
    with pytest.raises(ValueError, match=r"appends\[0\] sequence is 18446744073709551616; it must fit in int64"):
        manager.step([(2**64, [1])])
    assert manager.length(sequence) == 0  # nothing was appended
    manager.check_invariants()


def test_a_token_id_over_int32_is_named_as_a_token():
    manager = make_manager()
    sequence = manager.create()
    with pytest.raises(kvcache.InvalidArgumentError,
                       match=r"^tokens\[2\] is 2147483648; token ids must fit in int32 \[-2147483648, 2147483647\]$"):
        manager.append(sequence, [1, 2, 2**31])
    with pytest.raises(ValueError, match=r"^tokens\[0\] is 2147483648; token ids must fit in int32"):
        manager.step([(sequence, [2**31])])
    with pytest.raises(ValueError, match=r"^tokens\[0\] is 36893488147419103232; token ids must fit in int32"):
        manager.adopt_prefix(sequence, [2**65])
    assert manager.length(sequence) == 0


def test_retention_priorities_order_eviction_and_bad_input_changes_nothing():
    manager = make_manager()
    evicted = []
    manager.set_eviction_callback(lambda group, page, page_hash: evicted.append(page))
    first, second = manager.create(), manager.create()
    manager.append(first, list(range(1, 9)))  # pages 0, 1
    manager.append(second, list(range(101, 109)))  # pages 2, 3
    manager.set_retention(first, 0, 8, 90)
    manager.set_retention(second, 4, 5, 10)  # token 4: page 3 only
    assert [manager.retention_priority(0, page) for page in range(4)] == [90, 90, 35, 10]
    with pytest.raises(kvcache.InvalidArgumentError, match=r"priority is 101; it must be in \[0, 100\]"):
        manager.set_retention(first, 0, 8, 101)
    with pytest.raises(kvcache.InvalidArgumentError, match=r"\[0, 9\); it must lie within \[0, 8\]"):
        manager.set_retention(first, 0, 9, 50)
    with pytest.raises(kvcache.InvalidArgumentError, match=r"unknown"):
        manager.set_retention(12345, 0, 0, 50)
    with pytest.raises(kvcache.OutOfRangeError, match=r"page 99"):
        manager.retention_priority(0, 99)
    assert [manager.retention_priority(0, page) for page in range(4)] == [90, 90, 35, 10]
    manager.free(first)  # cached at 90: 1, 0
    manager.free(second)  # page 3 at 10, page 2 at 35
    assert manager.evict_cached(0, 4) == 4
    assert evicted == [3, 2, 1, 0]  # lowest priority first; without priorities 1, 0, 3, 2
    manager.check_invariants()


def make_state_manager(**options):
    conv = kvcache.StateTensorConfig("conv", [8, 3], kvcache.DataType.FLOAT16)
    config = kvcache.Config(layer_configs=[(1, 8)], max_batch_size=3, max_sequence_length=64, tokens_per_page=P,
                            max_tokens_per_step=64, state_layer_configs=[kvcache.StateLayerConfig([conv])],
                            num_checkpoint_slots=1)
    return kvcache.PageManager(config, **options)


def test_state_slots_follow_create_fork_and_free():
    manager = make_state_manager()
    a = manager.create()
    b = manager.fork(a)  # slot 1, its state copied from slot 0 before the next step's kernels
    assert (manager.state_slot(a), manager.state_slot(b)) == (0, 1)
    assert manager.pending_state_copies() == [(0, 1)]
    c = manager.fork(b)  # b's state is still in slot 0
    assert manager.pending_state_copies() == [(0, 1), (0, 2)]
    manager.free(a)  # a copy still reads slot 0: it is held until the step
    with pytest.raises(kvcache.InvalidArgumentError, match="held until the next step"):
        manager.create()
    assert manager.step([(b, [1]), (c, [2])]) == [[]]  # no page copy: the forks share pages
    assert manager.last_state_copies() == [(0, 1), (0, 2)]
    assert manager.pending_state_copies() == []
    d = manager.create()
    assert manager.state_slot(d) == 0
    assert manager.state_slots([c, d, b]) == [2, 0, 1]
    with pytest.raises(kvcache.InvalidArgumentError, match=r"sequences\[1\]"):
        manager.state_slots([c, a])
    manager.check_invariants()


def test_state_slots_without_state_layers_are_minus_one():
    manager = make_manager()
    a = manager.create()
    b = manager.fork(a)
    assert manager.state_slot(b) == -1 and manager.state_slots([a, b]) == [-1, -1]
    manager.step([(a, [1])])
    assert manager.last_state_copies() == [] and manager.pending_state_copies() == []


def test_more_sequences_than_state_slots_is_refused():
    with pytest.raises(kvcache.InvalidArgumentError, match="maxSequences is 4"):
        make_state_manager(max_sequences=4)
