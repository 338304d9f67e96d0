"""StepArguments: a step's kernel arguments for every page group in one call, checked against an independent
construction from PageManager.pages(), length() and state_slot(). Construction allocates pinned and device memory, so all but the
size checks take the `torch` fixture (skipped without a GPU)."""

import pytest

import kvcache

UNUSED = kvcache.UNUSED_PAGE_ENTRY
P = 4
MAX_BATCH = 4
MAX_TOKENS = 16


def make_manager(state_layers=False):
    # Full attention (24 pages a sequence) and a window of 6 tokens: ceil((6 - 1 + 16) / 4) + 1 = 7 pages a sequence.
    conv = kvcache.StateTensorConfig("conv", [8, 3], kvcache.DataType.FLOAT16)
    config = kvcache.Config(layer_configs=[(1, 8), (1, 8, 6)], max_batch_size=MAX_BATCH, max_sequence_length=96,
                            tokens_per_page=P, max_tokens_per_step=MAX_TOKENS,
                            state_layer_configs=[kvcache.StateLayerConfig([conv])] if state_layers else [])
    return kvcache.PageManager(config)


def expected(manager, entries):
    """The arguments of the documentation, from pages() and length() alone."""
    positions, qo_indptr = [], [0]
    for row, (sequence, tokens) in enumerate(entries):
        length = manager.length(sequence)
        positions += [[row, p] for p in range(length - len(tokens), length)]
        qo_indptr.append(len(positions))
    groups = []
    for group in range(2):
        indptr, indices, last, first, resident = [0], [], [], [], []
        for sequence, _ in entries:
            pages, length = manager.pages(sequence, group)
            released = next((i for i, page in enumerate(pages) if page != UNUSED), len(pages))
            indices += pages[released:]
            indptr.append(len(indices))
            last.append(0 if length == 0 else (length - 1) % P + 1)
            first.append(released * P)
            resident.append(length - released * P)
        groups.append((indptr, indices, last, first, resident))
    return positions, qo_indptr, groups


def test_sizes_are_checked_before_any_cuda_call():
    manager = make_manager()
    # Stream 0 (the legacy default stream) is taken as given, so nothing before the size checks calls CUDA.
    with pytest.raises(kvcache.InvalidArgumentError, match="maxBatchSize is 0"):
        kvcache.StepArguments(manager, 0, MAX_TOKENS, stream=0)
    with pytest.raises(kvcache.InvalidArgumentError, match="maxTokensPerStep is -1"):
        kvcache.StepArguments(manager, MAX_BATCH, -1, stream=0)
    with pytest.raises(TypeError, match="manager"):
        kvcache.StepArguments(object(), MAX_BATCH, MAX_TOKENS, stream=0)


def test_steps_give_the_arguments_of_the_pages(torch):
    manager = make_manager()
    arguments = kvcache.StepArguments(manager, MAX_BATCH, MAX_TOKENS, torch.cuda.current_stream())
    assert arguments.max_pages_per_sequence(0) == 24 and arguments.max_pages_per_sequence(1) == 7
    a, b = manager.create(), manager.create()
    steps = [[(a, list(range(10))), (b, list(range(5)))]]
    steps += [[(a, [1]), (b, [] if i % 3 == 0 else [2])] for i in range(60)]
    for entries in steps:
        manager.step(entries)
        arguments.build(entries)
        torch.cuda.synchronize()
        positions, qo_indptr, groups = expected(manager, entries)
        assert torch.from_dlpack(arguments.positions()).tolist() == positions
        assert torch.from_dlpack(arguments.qo_indptr()).tolist() == qo_indptr
        assert torch.from_dlpack(arguments.token_count()).tolist() == [len(positions)]
        full = torch.from_dlpack(arguments.positions(full=True)).tolist()
        assert full[len(positions):] == [[-1, 0]] * (MAX_TOKENS - len(positions))
        for group, (indptr, indices, last, first, resident) in enumerate(groups):
            assert torch.from_dlpack(arguments.indptr(group)).tolist() == indptr
            assert torch.from_dlpack(arguments.indices(group)).tolist() == indices
            assert torch.from_dlpack(arguments.last_page_len(group)).tolist() == last
            assert torch.from_dlpack(arguments.first_token(group)).tolist() == first
            assert torch.from_dlpack(arguments.resident_tokens(group)).tolist() == resident
            table = torch.from_dlpack(arguments.block_table(group)).tolist()
            for row in range(len(entries)):
                width = arguments.max_pages_per_sequence(group)
                count = indptr[row + 1] - indptr[row]
                assert table[row] == indices[indptr[row]:indptr[row + 1]] + [UNUSED] * (width - count)
    # The windowed rows start far into the sequences by now.
    assert arguments.host_first_token(1)[0] > 0
    # Entries may also give token counts.
    manager.step([(a, [5, 6])])
    arguments.build([(a, 2)])
    assert arguments.host_qo_indptr()[:2] == [0, 2]


def test_bad_entries_are_refused_and_change_nothing(torch):
    manager = make_manager()
    arguments = kvcache.StepArguments(manager, MAX_BATCH, MAX_TOKENS, torch.cuda.current_stream())
    a = manager.create()
    manager.step([(a, [1, 2, 3])])
    arguments.build([(a, [1, 2, 3])])
    before = arguments.host_positions()
    with pytest.raises(kvcache.InvalidArgumentError, match=r"entries\[0\]\.count is 4; it must be in \[0, 3\]"):
        arguments.build([(a, 4)])
    with pytest.raises(kvcache.InvalidArgumentError, match=r"entries\[0\]\.sequence is 12345"):
        arguments.build([(12345, 0)])
    with pytest.raises(kvcache.InvalidArgumentError, match=r"count is 5; it must be in \[0, 4\]"):
        arguments.build([(a, 0)] * 5)
    with pytest.raises(kvcache.OutOfRangeError):
        arguments.indptr(2)
    assert arguments.host_positions() == before


def test_state_slots_are_each_entry_s_slot_and_minus_one_past_count(torch):
    manager = make_manager(state_layers=True)
    arguments = kvcache.StepArguments(manager, MAX_BATCH, MAX_TOKENS, torch.cuda.current_stream())
    a, b, c = manager.create(), manager.create(), manager.create()
    d = manager.fork(a)
    manager.free(b)
    e = manager.create()
    # By hand: a, b, c took slots 0, 1, 2; the fork d the unused 3; e the freed b's 1.
    steps = [[(a, [1, 2]), (c, [3])], [(d, [4]), (e, [5, 6]), (a, [7]), (c, [])], [(e, [8])]]
    by_hand = [[0, 2], [3, 1, 0, 2], [1]]
    for entries, slots in zip(steps, by_hand):
        manager.step(entries)
        arguments.build(entries)
        torch.cuda.synchronize()
        assert [manager.state_slot(sequence) for sequence, _ in entries] == slots
        padded = slots + [-1] * (MAX_BATCH - len(slots))
        assert arguments.host_state_slots() == padded
        assert torch.from_dlpack(arguments.state_slots()).tolist() == slots
        assert torch.from_dlpack(arguments.state_slots(full=True)).tolist() == padded


def test_state_slots_without_state_layers_are_minus_one(torch):
    manager = make_manager()
    arguments = kvcache.StepArguments(manager, MAX_BATCH, MAX_TOKENS, torch.cuda.current_stream())
    a, b = manager.create(), manager.create()
    manager.step([(a, [1]), (b, [2, 3])])
    arguments.build([(a, [1]), (b, [2, 3])])
    torch.cuda.synchronize()
    assert arguments.host_state_slots() == [-1] * MAX_BATCH
    assert torch.from_dlpack(arguments.state_slots()).tolist() == [-1, -1]
