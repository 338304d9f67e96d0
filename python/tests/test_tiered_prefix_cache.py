"""TieredPrefixCache through Python. The host tests check what is refused before any CUDA call; the GPU tests take the
`torch` fixture (skipped without a GPU or torch, failed under KVCACHE_REQUIRE_GPU=1) and follow
tests/tiers/tiered/test_tiered_prefix_cache.cu: a prompt's pages are evicted by later steps, whose kernels (modelled by a reset of
the pages each step took) overwrite them at once, so a page reaches the host only if its offload was ordered first;
the device is then poisoned and admit() brings the pages back, compared with what they held (every layer, K and V,
which hold distinct values; a latent layer's one half). A hybrid cache's windowed group comes back through its own
tier, and a prompt whose full-attention pages the device still has holds them and onboards only its window. Host
pages are poisoned when the tiers are made, so the bytes a host page is expected to hold (the group's
layers in order, K then V) are never what was there before. Misuse is tested in test_tiered_prefix_cache_misuse.py."""

import pytest

import kvcache
from test_gpu import fill_distinct, pools_of
from test_sequence_file import POISON

P = 16  # tokens per page
STEP = 32  # max_tokens_per_step: an onboarded run of five pages is longer
SEQ = 128
STEP_WRITE = 0x5A5A5A5A  # what the steps' kernels are modelled writing into the pages a step took
# Three layers of different shapes, one of them latent (K only): one full-attention group.
MIXED = [(2, 64), (1, 96, 0, kvcache.KVLayerKind.LATENT), (3, 40)]
# A window of 32 tokens (group 1, layer 0) and full attention (group 0, layer 1).
WINDOWED = [(2, 32, 32), (2, 64)]
STATS_FIELDS = ["admissions", "query_tokens", "device_hit_tokens", "host_hit_tokens", "missed_tokens",
                "offloaded_pages", "already_on_host_pages", "dropped_pages", "evicted_host_pages", "onboarded_pages",
                "spilled_pages", "already_on_disk_pages", "evicted_disk_pages", "restored_pages", "disk_failures",
                "disk_hit_tokens", "offloaded_states", "dropped_states", "released_states", "onboarded_states",
                "spilled_states", "restored_states"]


def make_config(layers, dtype=kvcache.DataType.FLOAT16, num_pages=0):
    return kvcache.Config(layer_configs=layers, max_batch_size=2, max_sequence_length=SEQ, tokens_per_page=P,
                          max_tokens_per_step=STEP, kv_cache_type=dtype, num_pages=num_pages)


def token_run(first, count):
    return [first + 3 * i for i in range(count)]


def stats_of(tiered):
    stats = tiered.stats()
    return {name: getattr(stats, name) for name in STATS_FIELDS}


# Host tests: no GPU needed.


def test_admission_and_counters_are_the_cpp_structs():
    admission = kvcache.TieredAdmission()
    assert (admission.device_tokens, admission.host_tokens, admission.compute_tokens) == (0, 0, 0)
    assert repr(admission) == "TieredAdmission(device_tokens=0, host_tokens=0, compute_tokens=0)"
    stats = kvcache.TieredPrefixCacheStats()
    assert sorted(name for name in dir(stats) if not name.startswith("_")) == sorted(STATS_FIELDS)
    assert [getattr(stats, name) for name in STATS_FIELDS] == [0] * len(STATS_FIELDS)
    assert repr(stats).startswith("TieredPrefixCacheStats(admissions=0, query_tokens=0, device_hit_tokens=0")
    with pytest.raises(AttributeError):
        stats.admissions = 1
    for name in ("TieredPrefixCache", "TieredAdmission", "TieredPrefixCacheStats"):
        assert name in kvcache.__all__


def test_a_tiered_cache_needs_a_cache_and_a_refusal_leaves_the_manager_alone():
    config = kvcache.Config(layer_configs=[(1, 8)], max_batch_size=2, max_sequence_length=64, tokens_per_page=4,
                            max_tokens_per_step=64)
    pages = kvcache.PageManager(config)
    evicted = []
    pages.set_eviction_callback(lambda group, page, page_hash: evicted.append((group, page)))
    for cache, name in (("cache", "str"), (None, "NoneType"), (3, "int"), (pages, "PageManager"),
                        (config, "Config")):
        with pytest.raises(TypeError, match=f"cache is a {name}; expected a KVCacheManager"):
            kvcache.TieredPrefixCache(cache, pages, [4])
    # Not served by a tiered cache: its own callback, step and append as before.
    sequence = pages.create()
    pages.step([(sequence, [1, 2, 3, 4])])
    page = pages.pages(sequence, 0)[0][0]
    pages.append(sequence, [5])
    pages.free(sequence)
    assert pages.evict_cached(0, 4) == 1
    assert evicted == [(0, page)]
    pages.set_eviction_callback(None)
    pages.check_invariants()


# GPU tests.


class Tiered:
    """A cache whose pools hold distinct values (`before`), its page manager (4 sequences) and a tiered cache over
    them with every host page poisoned, all on torch's current stream."""

    def __init__(self, torch, layers, dtype, num_host_pages, **disk):
        self.torch = torch
        self.cache = kvcache.KVCacheManager(make_config(layers, dtype), torch.cuda.current_stream())
        self.pools = pools_of(torch, self.cache)
        self.before = fill_distinct(torch, self.pools)
        self.pages = kvcache.PageManager(self.cache, max_sequences=4)
        self.tiered = kvcache.TieredPrefixCache(self.cache, self.pages, num_host_pages, **disk)
        for group in range(self.tiered.num_groups()):
            tier = self.tiered.host_tier(group)
            tier.wait_until_ready()
            for host_page in range(tier.num_host_pages()):
                torch.from_dlpack(tier.host_page_view(host_page)).fill_(POISON)

    def prefill(self, sequence, tokens, written=None, after_step=None):
        """Steps tokens[length:] into `sequence` through the tiered cache, STEP tokens at a time; after each step
        the pages it took are reset to `written` (its kernels, on the same stream) unless it is None."""
        length = self.pages.length(sequence)
        while length < len(tokens):
            count = min(STEP, len(tokens) - length)
            held = [len(self.pages.pages(sequence, g)[0]) for g in range(self.pages.num_groups())]
            self.tiered.step([(sequence, tokens[length:length + count])])
            for group in range(self.pages.num_groups()):
                taken = [page for page in self.pages.pages(sequence, group)[0][held[group]:] if page >= 0]
                if written is not None and taken:
                    self.cache.reset_pages(taken, pattern=written, group=group)
            if after_step is not None:
                after_step()
            length = self.pages.length(sequence)

    def prompt_hashes(self, tokens):
        """The hashes the whole pages of `tokens` are registered under from a sequence's start."""
        probe = self.pages.create()
        hashes = self.pages.hash_next_pages(probe, tokens)
        self.pages.free(probe)
        return hashes

    def model_host_page(self, group, page):
        """The bytes page `page` of `group` held when the pools were filled: the group's layers in order, each
        layer's K page then its V page (a latent layer: its one page)."""
        torch = self.torch
        parts = [self.before[layer][half, page].reshape(-1).view(torch.uint8)
                 for layer in self.cache.group(group).layers for half in range(self.before[layer].shape[0])]
        return torch.cat(parts).cpu()

    def host_bytes(self, group, host_page):
        return self.torch.from_dlpack(self.tiered.host_tier(group).host_page_view(host_page)).clone()

    def assert_moved(self, group, moves):
        """Each (src, dst): page dst of every layer of `group` holds what page src held when the pools were filled."""
        self.torch.cuda.synchronize()
        for src, dst in moves:
            for layer in self.cache.group(group).layers:
                now = self.pools[layer].view(self.torch.int16)[:, dst]
                assert self.torch.equal(now, self.before[layer][:, src]), f"group {group} layer {layer} {src}->{dst}"

    def poison_device(self):
        for pool in self.pools:
            pool.view(self.torch.uint8).fill_(POISON)


def test_pages_evicted_by_later_steps_come_back_from_the_host_bitwise(torch):
    numpy = pytest.importorskip("numpy")
    s = Tiered(torch, MIXED, kvcache.DataType.BFLOAT16, [16])
    assert (s.cache.num_groups(), s.cache.group(0).num_pages, s.tiered.num_groups()) == (1, 16, 1)
    prompt = token_run(1, 5 * P + 5)

    # The donor's pages keep the values they were filled with: what its prefill computed.
    donor = s.pages.create()
    first = s.tiered.admit(donor, numpy.array(prompt, dtype=numpy.int32))
    assert (first.device_tokens, first.host_tokens, first.compute_tokens) == (0, 0, len(prompt))
    s.prefill(donor, prompt)
    donor_pages = s.pages.pages(donor, 0)[0][:5]
    assert not torch.equal(s.before[0][0, donor_pages[0]], s.before[0][1, donor_pages[0]])  # K and V differ
    s.pages.free(donor)
    assert s.pages.counts(0).cached == 5

    # Two requests of other tokens take every page: the second evicts the donor's five, and its steps' kernels
    # overwrite them at once, on the same stream.
    fillers = []
    for f in range(2):
        other = token_run(10000 * (f + 1), SEQ)
        filler = s.pages.create()
        assert s.tiered.admit(filler, other).compute_tokens == SEQ
        s.prefill(filler, other, written=STEP_WRITE)
        fillers.append(filler)
    assert stats_of(s.tiered) == dict(dict.fromkeys(STATS_FIELDS, 0), admissions=3, query_tokens=len(prompt) + 2 * SEQ,
                                      missed_tokens=len(prompt) + 2 * SEQ, offloaded_pages=5)
    assert s.tiered.num_host_pages_held(0) == 5
    held = [s.tiered.find_host_page(0, page_hash) for page_hash in s.prompt_hashes(prompt[:5 * P])]
    assert min(held) >= 0 and len(set(held)) == 5
    for page, host_page in zip(donor_pages, held):
        assert torch.equal(s.host_bytes(0, host_page), s.model_host_page(0, page)), page
    for host_page in set(range(16)) - set(held):
        assert bool((s.host_bytes(0, host_page) == POISON).all()), host_page
    s.tiered.check_invariants()

    for filler in fillers:
        s.pages.free(filler)
    s.poison_device()
    torch.cuda.synchronize()
    s.tiered.reset_stats()
    assert stats_of(s.tiered) == dict.fromkeys(STATS_FIELDS, 0)

    request = s.pages.create()
    admission = s.tiered.admit(request, prompt)
    assert (admission.device_tokens, admission.host_tokens, admission.compute_tokens) == (0, 5 * P, 5)
    onboarded, length = s.pages.pages(request, 0)
    assert (len(onboarded), length) == (5, 5 * P)
    s.assert_moved(0, zip(donor_pages, onboarded))
    stats = stats_of(s.tiered)
    assert (stats["admissions"], stats["query_tokens"], stats["device_hit_tokens"], stats["host_hit_tokens"],
            stats["missed_tokens"], stats["onboarded_pages"]) == (1, len(prompt), 0, 5 * P, 5, 5)

    # The onboarded pages are registered: the next request adopts them on the device.
    s.prefill(request, prompt)
    s.pages.free(request)
    again = s.pages.create()
    assert s.tiered.admit(again, prompt).device_tokens == 5 * P
    assert s.pages.pages(again, 0)[0] == onboarded
    assert s.tiered.stats().device_hit_tokens == 5 * P
    s.tiered.check_invariants()
    s.pages.check_invariants()


def test_a_windowed_groups_pages_come_back_through_its_own_tier(torch, tmp_path):
    numpy = pytest.importorskip("numpy")
    s = Tiered(torch, WINDOWED, kvcache.DataType.FLOAT16, [16, 16])
    assert (s.cache.group(0).layers, s.cache.group(1).layers, s.cache.group(1).sliding_window) == ([1], [0], 32)
    prompt = token_run(7, 5 * P + 3)

    donor = s.pages.create()
    s.tiered.admit(donor, prompt)
    windowed_page_of = {}  # the windowed group's page of each prompt page, seen while the window holds it

    def see_window():
        for index, page in enumerate(s.pages.pages(donor, 1)[0]):
            if page >= 0:
                windowed_page_of[index] = page

    s.prefill(donor, prompt, after_step=see_window)
    page_of = [s.pages.pages(donor, 0)[0][:5], [windowed_page_of[p] for p in range(5)]]
    s.pages.free(donor)
    assert (s.tiered.evict_cached(0, 64), s.tiered.evict_cached(1, 64)) == (5, 5)
    assert s.tiered.stats().offloaded_pages == 10

    # Both tiers hold the prompt's pages; a lent tier saves them to a sequence file.
    hashes = s.prompt_hashes(prompt[:5 * P])
    held = [[s.tiered.find_host_page(group, page_hash) for page_hash in hashes] for group in range(2)]
    for group in range(2):
        assert s.tiered.num_host_pages_held(group) == 5 and min(held[group]) >= 0
        for page, host_page in zip(page_of[group], held[group]):
            assert torch.equal(s.host_bytes(group, host_page), s.model_host_page(group, page)), (group, page)
    tier = s.tiered.host_tier(0)
    path = tmp_path / "prompt.kvseq"
    kvcache.save_sequence(path, tier, held[0], 5 * P)
    info = kvcache.read_sequence_file_info(path)
    assert (info.page_count, info.token_count, info.geometry) == (5, 5 * P, tier.geometry())
    out = numpy.full((5, tier.host_page_bytes()), POISON, dtype=numpy.uint8)
    assert kvcache.read_sequence_file(path, tier.geometry(), out) == 5 * P
    for row, page in zip(out, page_of[0]):
        assert numpy.array_equal(row, s.model_host_page(0, page).numpy())

    s.poison_device()
    request = s.pages.create()
    admission = s.tiered.admit(request, prompt)
    assert (admission.device_tokens, admission.host_tokens, admission.compute_tokens) == (0, 5 * P, 3)
    window = (5 * P - 32 + 1) // P  # the window before token 80: tokens 49-79, pages 3 and 4
    assert s.tiered.stats().onboarded_pages == 5 + (5 - window)
    full = s.pages.pages(request, 0)[0]
    s.assert_moved(0, zip(page_of[0], full))
    windowed = s.pages.pages(request, 1)[0]
    assert [page >= 0 for page in windowed[:5]] == [p >= window for p in range(5)]
    s.assert_moved(1, [(page_of[1][p], windowed[p]) for p in range(window, 5)])

    # A shorter prompt: the device has its full-attention pages (the request's, cached) but not its window (pages 0
    # and 1, which the admission above did not need): it holds the former and onboards only the latter.
    s.pages.free(request)
    s.tiered.reset_stats()
    adopter = s.pages.create()
    partly = s.tiered.admit(adopter, prompt[:2 * P + 1])
    assert (partly.device_tokens, partly.host_tokens, s.tiered.stats().onboarded_pages) == (0, 2 * P, 2)
    assert s.pages.pages(adopter, 0)[0][:2] == full[:2]
    s.assert_moved(0, zip(page_of[0][:2], full[:2]))
    window_pages = s.pages.pages(adopter, 1)[0]
    assert min(window_pages[:2]) >= 0
    s.assert_moved(1, zip(page_of[1][:2], window_pages[:2]))
    s.pages.check_invariants()
    s.tiered.check_invariants()


def test_a_step_runs_its_copies_on_the_stream(torch):
    s = Tiered(torch, WINDOWED, kvcache.DataType.FLOAT16, [4, 4])
    parent = s.pages.create()
    tokens = token_run(5, P + 4)  # a whole page and 4 tokens of a second, in both groups
    assert s.tiered.admit(parent, tokens).compute_tokens == len(tokens)
    assert s.tiered.step([(parent, tokens)]) == [[], []]
    child = s.pages.fork(parent)
    copies = s.tiered.step([(child, [99])])  # the child writes into the shared partial page: copy-on-write
    for group in range(2):
        parent_pages, child_pages = s.pages.pages(parent, group)[0], s.pages.pages(child, group)[0]
        assert child_pages[0] == parent_pages[0] and child_pages[1] != parent_pages[1]
        assert copies[group] == [(parent_pages[1], child_pages[1])]
        s.assert_moved(group, copies[group])
    s.tiered.check_invariants()


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the refused calls captured nothing
def test_a_capturing_stream_is_refused_before_anything_changes(torch):
    s = Tiered(torch, MIXED, kvcache.DataType.FLOAT16, [8])
    prompt = token_run(1, 3 * P + 1)
    donor = s.pages.create()
    s.tiered.admit(donor, prompt)
    s.prefill(donor, prompt)
    s.pages.free(donor)
    assert s.tiered.evict_cached(0, 16) == 3
    before = stats_of(s.tiered)
    request = s.pages.create()
    torch.cuda.synchronize()
    calls = {"admit": lambda stream: s.tiered.admit(request, prompt, stream),
             "step": lambda stream: s.tiered.step([(request, prompt[:P])], stream),
             "evictCached": lambda stream: s.tiered.evict_cached(0, 1, stream)}
    for name, call in calls.items():
        with pytest.raises(kvcache.InvalidArgumentError, match=rf"TieredPrefixCache::{name}: the stream is capturing"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                call(torch.cuda.current_stream())
    assert s.pages.length(request) == 0
    assert stats_of(s.tiered) == before
    assert s.tiered.num_host_pages_held(0) == 3
    # Outside the capture the same admission finds the host's pages.
    assert s.tiered.admit(request, prompt).host_tokens == 3 * P
    s.tiered.check_invariants()


def test_pages_the_host_gives_up_come_back_from_the_disk(torch, tmp_path):
    # A host tier of five pages: the donor's five pages fill it, then three pages of another prompt take the host
    # pages of the donor's oldest three (evicted one a call), which go to the disk tier first.
    directory = tmp_path / "disk"
    s = Tiered(torch, MIXED, kvcache.DataType.BFLOAT16, [5], disk_directory=directory, num_disk_pages=[16])
    prompt = token_run(1, 5 * P + 5)
    donor = s.pages.create()
    s.tiered.admit(donor, prompt)
    s.prefill(donor, prompt)
    donor_pages = s.pages.pages(donor, 0)[0][:5]
    s.pages.free(donor)

    def evict_one_by_one():
        while s.pages.counts(0).cached > 0:
            s.tiered.evict_cached(0, 1)

    evict_one_by_one()
    other = token_run(10000, 3 * P + 1)
    filler = s.pages.create()
    s.tiered.admit(filler, other)
    s.prefill(filler, other, written=STEP_WRITE)
    s.pages.free(filler)
    evict_one_by_one()
    assert (s.tiered.stats().spilled_pages, s.tiered.num_disk_pages_held(0)) == (3, 3)
    hashes = s.prompt_hashes(prompt[:5 * P])
    assert [s.tiered.find_disk_page(0, page_hash) >= 0 for page_hash in hashes].count(True) == 3
    assert len(list(directory.glob("*.kvseq"))) == 3

    s.poison_device()
    torch.cuda.synchronize()
    s.tiered.reset_stats()
    request = s.pages.create()
    admission = s.tiered.admit(request, prompt)
    assert (admission.device_tokens, admission.host_tokens, admission.compute_tokens) == (0, 5 * P, 5)
    stats = s.tiered.stats()
    assert (stats.restored_pages, stats.onboarded_pages, stats.disk_failures) == (3, 5, 0)
    s.assert_moved(0, zip(donor_pages, s.pages.pages(request, 0)[0]))
    s.tiered.check_invariants()
    del s
    import gc
    gc.collect()
    assert list(directory.glob("*.kvseq")) == []  # the disk tier's files go with it



def test_a_checkpoints_state_goes_to_the_host_with_its_page_and_comes_back_bitwise(torch):
    """A hybrid model's checkpoint (a state layer, one checkpoint slot): evicted with its carrier page into a host
    state, then onboarded into the checkpoint slot by an admission of the same prompt, and restored into the new
    sequence's slot by the next step's state copies; every state slot is poisoned in between."""
    from test_state_layers_gpu import BATCH, make_cache as make_state_cache, state_layer

    cache = make_state_cache(torch, [state_layer({"recurrent": [2, 4, 4]})])
    pages = kvcache.PageManager(cache, max_sequences=BATCH)
    tiered = kvcache.TieredPrefixCache(cache, pages, [8], num_host_states=2)
    assert tiered.checkpoint_group() == 0
    view = torch.from_dlpack(cache.state_view(0, "recurrent"))
    state = torch.arange(32, dtype=torch.float32, device=view.device).reshape(2, 4, 4) * 1.25 + 0.5
    prompt = token_run(11, 3 * P + 1)

    first = pages.create()
    assert tiered.admit(first, prompt).compute_tokens == len(prompt)
    assert pages.checkpoint_boundary(first) == 3 * P
    tiered.step([(first, prompt[:3 * P])])
    cache.copy_states(pages.last_state_copies())
    view[pages.state_slot(first)].copy_(state)  # the step's kernels leave the state after token 48
    assert pages.checkpoint_state(first)
    tiered.step([(first, prompt[3 * P:])])
    cache.copy_states(pages.last_state_copies())  # the save, before the kernels overwrite the slot
    view[pages.state_slot(first)].fill_(-1.0)
    pages.free(first)
    probe = pages.create()
    last = pages.hash_next_pages(probe, prompt[:3 * P])[2]
    pages.free(probe)
    assert pages.checkpoint_slot(last) >= BATCH

    assert tiered.evict_cached(0, 64) == 3
    assert tiered.num_host_states_held() == 1
    host_state = tiered.find_host_state(last)
    assert host_state >= 0
    tier = tiered.host_tier(tiered.checkpoint_group())
    held = torch.from_dlpack(tier.host_state_view(host_state)).clone()
    assert torch.equal(held, state.cpu().reshape(-1).view(torch.uint8))

    view.view(torch.uint8).fill_(POISON)
    second = pages.create()
    admission = tiered.admit(second, prompt)
    assert (admission.device_tokens, admission.host_tokens, admission.compute_tokens) == (0, 3 * P, 1)
    torch.cuda.synchronize()
    slot = pages.checkpoint_slot(last)
    assert torch.equal(view[slot], state)
    tiered.step([(second, prompt[3 * P:])])
    copies = pages.last_state_copies()
    assert [tuple(copy) for copy in copies] == [(slot, pages.state_slot(second))]
    cache.copy_states(copies)
    torch.cuda.synchronize()
    assert torch.equal(view[pages.state_slot(second)], state)
    stats = tiered.stats()
    assert (stats.offloaded_states, stats.onboarded_states, stats.dropped_states) == (1, 1, 0)
    tiered.check_invariants()
