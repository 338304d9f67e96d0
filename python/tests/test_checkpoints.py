"""State checkpoints of a PageManager through Python (the "State checkpoints" paragraph of
kvcache/paging/page_manager.h): the boundaries a prompt is checkpointed at, the save and restore copies (source slot,
destination slot), the clock that reuses checkpoint slots, checkpoints dropped with their carrier page, and misuse
refused with named errors. Every expected value is worked out by hand from the header's rules. No GPU.

The managers here: one full-attention layer, 4 tokens a page, one state layer, max_batch_size 3, so sequences hold
state slots 0 to 2 and checkpoint slots are 3 and up."""

import pytest

import kvcache

P = 4  # tokens per page
RUNNING = 3  # max_batch_size: the first checkpoint slot


def make_manager(checkpoint_slots=2, state_layers=True, **options):
    conv = kvcache.StateTensorConfig("conv", [8, 3], kvcache.DataType.FLOAT16)
    config = kvcache.Config(layer_configs=[(1, 8)], max_batch_size=RUNNING, max_sequence_length=64,
                            tokens_per_page=P, max_tokens_per_step=64,
                            state_layer_configs=[kvcache.StateLayerConfig([conv])] if state_layers else [],
                            num_checkpoint_slots=checkpoint_slots)
    return kvcache.PageManager(config, **options)


def page_hashes(manager, tokens):
    """The hashes the whole pages of `tokens` have at the start of a sequence (hash_next_pages on a new one)."""
    probe = manager.create()
    hashes = manager.hash_next_pages(probe, tokens)
    manager.free(probe)
    return hashes


def prefill_with_checkpoint(manager, prompt):
    """Runs `prompt` on a new sequence as a runtime does: adopt_prefix, then chunks that end at each boundary the
    manager asks for, checkpoint_state after the step that reaches it. Returns the sequence and the copies queued at
    each save."""
    sequence = manager.create()
    at = manager.adopt_prefix(sequence, prompt)
    saves = []
    while at < len(prompt):
        boundary = manager.checkpoint_boundary(sequence)
        end = boundary if at < boundary < len(prompt) else len(prompt)
        manager.step([(sequence, prompt[at:end])])
        at = end
        if at == boundary:
            assert manager.checkpoint_state(sequence)
            saves.append(manager.pending_state_copies())
    return sequence, saves


def test_a_prompt_is_checkpointed_at_its_last_whole_page_and_a_second_sequence_restores_it():
    manager = make_manager()
    prompt = list(range(100, 111))  # 11 tokens: whole pages before the last token end at 8
    first = manager.create()
    assert manager.state_slot(first) == 0
    assert manager.checkpoint_boundary(first) == -1  # offered no prompt yet
    assert manager.adopt_prefix(first, prompt) == 0  # nothing cached
    assert manager.checkpoint_boundary(first) == 8
    manager.step([(first, prompt[:8])])
    assert manager.checkpoint_state(first)
    # The first empty checkpoint slot, 3, takes the state of the sequence's slot 0.
    assert manager.pending_state_copies() == [(0, 3)]
    assert manager.num_checkpoints() == 1
    hashes = page_hashes(manager, prompt[:8])
    assert manager.checkpoint_slot(hashes[1]) == 3  # keyed by the hash of the prefix's last page, filling still
    assert manager.checkpoint_slot(hashes[0]) == -1
    assert manager.checkpoint_boundary(first) == -1  # nothing more is asked for
    manager.step([(first, prompt[8:])])
    assert manager.last_state_copies() == [(0, 3)]
    assert manager.pending_state_copies() == []

    second = manager.create()
    assert manager.state_slot(second) == 1
    # Two pages cached and a checkpoint after token 8: the whole 8 tokens, the state restored from slot 3.
    assert manager.adopt_prefix(second, prompt) == 8
    assert manager.pending_state_copies() == [(3, 1)]
    assert manager.pages(second, 0) == (manager.pages(first, 0)[0][:2], 8)
    assert manager.checkpoint_boundary(second) == -1  # its prompt's boundary is the one it adopted
    manager.step([(second, prompt[8:])])
    assert manager.last_state_copies() == [(3, 1)]
    stats = manager.stats()
    assert (stats.checkpoints_saved, stats.checkpoints_restored, stats.checkpoints_dropped) == (1, 1, 0)
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (22, 8)
    manager.check_invariants()


def test_a_match_without_a_checkpoint_asks_for_one_where_it_ends():
    manager = make_manager()
    shared = list(range(100, 111))
    donor, saves = prefill_with_checkpoint(manager, shared)
    assert saves == [[(0, 3)]]
    manager.free(donor)
    # Shares page 0 only: the cached run is 1 page, with no checkpoint after it, so nothing is adopted; the manager
    # asks for the state after the run (token 4), then after the prompt's last whole page before its last token (12).
    branch = shared[:4] + list(range(500, 512))  # 16 tokens
    sequence = manager.create()
    assert manager.state_slot(sequence) == 0
    assert manager.adopt_prefix(sequence, branch) == 0
    assert manager.checkpoint_boundary(sequence) == 4
    manager.step([(sequence, branch[:4])])
    assert manager.checkpoint_state(sequence)
    assert manager.pending_state_copies() == [(0, 4)]  # slot 3 holds the donor's checkpoint
    assert manager.checkpoint_boundary(sequence) == 12
    assert manager.checkpoint_slot(page_hashes(manager, branch[:4])[0]) == 4
    manager.check_invariants()


def test_checkpoint_interval_pages_asks_for_every_nth_page_besides_the_prompts_boundary():
    manager = make_manager(checkpoint_interval_pages=2)
    prompt = list(range(1, 22))  # 21 tokens: the prompt's boundary is 20; every 2 pages is every 8 tokens
    sequence = manager.create()
    assert manager.adopt_prefix(sequence, prompt) == 0
    boundaries = []
    at = 0
    while at < len(prompt):
        boundary = manager.checkpoint_boundary(sequence)
        boundaries.append(boundary)
        end = min(boundary, len(prompt))
        manager.step([(sequence, prompt[at:end])])
        at = end
    assert boundaries == [8, 16, 20, 24]
    manager.step([(sequence, list(range(39)))])  # 60 tokens
    assert manager.checkpoint_boundary(sequence) == 64  # the last one within max_sequence_length
    manager.step([(sequence, [1, 2, 3, 4])])
    assert manager.checkpoint_boundary(sequence) == -1


def test_the_clock_keeps_a_checkpoint_that_was_hit_and_reuses_one_that_was_not():
    manager = make_manager(checkpoint_slots=2)
    x, y, z = (list(range(base, base + 9)) for base in (100, 200, 300))  # 9 tokens: a boundary at 8 each
    for prompt, slot in ((x, 3), (y, 4)):
        sequence, saves = prefill_with_checkpoint(manager, prompt)
        assert saves == [[(0, slot)]]
        manager.free(sequence)
    reader = manager.create()
    assert manager.adopt_prefix(reader, x) == 8  # a hit on slot 3
    manager.step([(reader, x[8:])])
    manager.free(reader)
    # Both slots are full: the hand starts at slot 3, lowers its hit count to 0 and passes; slot 4, never hit, is
    # reused and y's checkpoint dropped.
    sequence, saves = prefill_with_checkpoint(manager, z)
    assert saves == [[(0, 4)]]
    assert manager.checkpoint_slot(page_hashes(manager, x)[1]) == 3
    assert manager.checkpoint_slot(page_hashes(manager, y)[1]) == -1
    assert manager.checkpoint_slot(page_hashes(manager, z)[1]) == 4
    assert manager.num_checkpoints() == 2
    assert manager.stats().checkpoints_dropped == 1
    # y's pages are still cached, but without a checkpoint its prefix cannot be adopted.
    assert manager.adopt_prefix(manager.create(), y) == 0
    manager.check_invariants()


def test_evicting_the_carrier_page_drops_the_checkpoint():
    manager = make_manager()
    prompt = list(range(100, 111))
    sequence, _ = prefill_with_checkpoint(manager, prompt)
    last_page = page_hashes(manager, prompt)[1]
    manager.free(sequence)
    assert manager.checkpoint_slot(last_page) == 3
    assert manager.evict_cached(0, 2) == 2  # the two registered pages: the prefix is gone, and its checkpoint
    assert manager.num_checkpoints() == 0
    assert manager.checkpoint_slot(last_page) == -1
    assert manager.stats().checkpoints_dropped == 1
    manager.check_invariants()


def test_without_checkpoint_slots_a_state_layout_asks_for_none_and_adopts_nothing():
    manager = make_manager(checkpoint_slots=0)
    prompt = list(range(100, 111))
    first = manager.create()
    assert manager.adopt_prefix(first, prompt) == 0
    assert manager.checkpoint_boundary(first) == -1
    manager.step([(first, prompt[:8])])
    assert not manager.checkpoint_state(first)
    assert manager.pending_state_copies() == [] and manager.num_checkpoints() == 0
    assert manager.adopt_prefix(manager.create(), prompt) == 0  # pages cached, no state to resume from
    manager.check_invariants()


def test_a_save_while_every_checkpoint_slot_fills_keeps_nothing():
    manager = make_manager(checkpoint_slots=2)
    sequences = [manager.create() for _ in range(3)]  # slots 0, 1, 2
    manager.step([(sequence, list(range(10 * i, 10 * i + 8))) for i, sequence in enumerate(sequences)])
    assert manager.checkpoint_state(sequences[0]) and manager.checkpoint_state(sequences[1])
    assert manager.pending_state_copies() == [(0, 3), (1, 4)]
    # Both checkpoint slots are filled by queued copies: none may be reused before the step.
    assert not manager.checkpoint_state(sequences[2])
    assert manager.pending_state_copies() == [(0, 3), (1, 4)] and manager.num_checkpoints() == 2
    manager.step([])  # hands the copies out
    assert manager.last_state_copies() == [(0, 3), (1, 4)]
    # Now the clock's hand, at slot 3 (never hit), reuses it.
    assert manager.checkpoint_state(sequences[2])
    assert manager.pending_state_copies() == [(2, 3)]
    # A prefix that has a checkpoint already: True, and no second copy.
    assert manager.checkpoint_state(sequences[2])
    assert manager.pending_state_copies() == [(2, 3)]
    stats = manager.stats()
    assert (stats.checkpoints_saved, stats.checkpoints_dropped) == (3, 1)
    manager.check_invariants()


def test_misuse_is_refused_by_name_and_changes_nothing():
    manager = make_manager()
    sequence = manager.create()
    with pytest.raises(kvcache.InvalidArgumentError,
                       match=r"checkpointState: sequence \d+ has 0 tokens; it must hold whole pages of 4 tokens"):
        manager.checkpoint_state(sequence)
    manager.step([(sequence, list(range(9)))])
    with pytest.raises(kvcache.InvalidArgumentError, match=r"has 9 tokens; it must hold whole pages of 4 tokens"):
        manager.checkpoint_state(sequence)
    assert manager.num_checkpoints() == 0 and manager.pending_state_copies() == []
    assert manager.stats().checkpoints_saved == 0
    for call in (manager.checkpoint_state, manager.checkpoint_boundary):
        with pytest.raises(kvcache.InvalidArgumentError, match=r"sequence 12345 is unknown"):
            call(12345)
    with pytest.raises(TypeError, match=r"hash"):
        manager.checkpoint_slot((1,))
    with pytest.raises(TypeError, match=r"hash"):
        manager.checkpoint_slot((-1, 0))
    manager.check_invariants()

    plain = make_manager(checkpoint_slots=0, state_layers=False)
    empty = plain.create()
    plain.append(empty, list(range(8)))
    with pytest.raises(kvcache.InvalidArgumentError, match=r"the layout has no state layers"):
        plain.checkpoint_state(empty)
    assert plain.checkpoint_boundary(empty) == -1 and plain.num_checkpoints() == 0

    with pytest.raises(kvcache.InvalidArgumentError, match=r"checkpointIntervalPages is -1; it must be >= 0"):
        make_manager(checkpoint_interval_pages=-1)
    with pytest.raises(kvcache.InvalidArgumentError,
                       match=r"checkpoint_interval_pages is 2147483648; it must fit in int32"):
        make_manager(checkpoint_interval_pages=2**31)
