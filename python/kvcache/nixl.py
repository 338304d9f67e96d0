"""Moves a kvcache cache's pages between processes with NIXL (disaggregated prefill and decode).

NIXL is not a dependency of kvcache: this module takes a ``nixl_agent`` the caller made (``nixl._api.nixl_agent``)
and uses only its public calls. Each side wraps its cache once::

    pages = NixlPages.for_cache(agent, cache)          # registers every pool with the agent
    agent_metadata, description = pages.metadata()     # send both to the other side

The side that pulls (the decode engine) adds each peer and pulls a sequence's pages, layer by layer::

    peer = pages.add_peer(their_agent_metadata, their_description)
    pull = pages.pull([peer], local_pages, remote_pages, group=0, num_tokens=n, notification=b"request-7")
    pull.wait_layer(0)      # layer 0 of the group has landed; attention over it may start
    pull.wait()             # every layer landed; the peers are notified (they may free their pages)

A pull names descriptors of lists each side prepares once per page group (NIXL's prep_xfer_dlist): one descriptor
per page half of each layer, or per run of the smaller page size where the two sides' page sizes differ
(``kvcache.transfer_prepared_descriptors``), the remote side's from the description the peer sent. A request then
computes only which descriptors it moves (``descriptor_runs``) and makes its transfers from them (make_prepped_xfer).
Where tensor-parallel ranks split a layer's heads differently, a head slice is one range per token; such pulls build
``kvcache.transfer_descriptors``' ranges instead (docs/transfer_descriptors.md).

A hybrid model's recurrent states move with ``pull_states``: one descriptor per state slot of each state layer's
tensor, prepared once per side (``kvcache.transfer_prepared_state_descriptors``), a sequence's state named by its
slot on each side (``PageManager.state_slots``)::

    pull = pages.pull_states(peer, local_slots, remote_slots)
"""

import time

import numpy as np

from . import _kvcache

_LOCAL_AGENT = "NIXL_INIT_AGENT"  # the name prep_xfer_dlist takes for the initiator's own descriptors


def descriptor_runs(local_pages, remote_pages, num_tokens, local_tokens_per_page, remote_tokens_per_page,
                    local_num_pages, remote_num_pages):
    """Which descriptors of one block of each side's prepared list (transfer_prepared_descriptors, at the smaller page
    size a descriptor) move tokens [0, num_tokens[s]) of each sequence s: local_pages[s] and remote_pages[s] are its
    page ids on each side, in its own page size (-1 for pages a window released; their tokens move nowhere). Returns
    two int64 arrays of the same length (sequence by sequence, in token order): descriptor local[i] of a local block
    and descriptor remote[i] of the remote block of the same layer, part and half hold the same bytes. The page lists
    may be lists of lists or [sequences, pages] arrays; num_tokens an int for every sequence or one per sequence.
    Raises InvalidArgumentError for a negative num_tokens or fewer pages than it needs, OutOfRangeError for a page id
    outside [0, num_pages) that is not -1."""
    run = min(local_tokens_per_page, remote_tokens_per_page)
    local_flat, local_starts, local_counts = _page_lists(local_pages)
    remote_flat, remote_starts, remote_counts = _page_lists(remote_pages)
    sequences = len(local_starts)
    if len(remote_starts) != sequences:
        raise _kvcache.InvalidArgumentError(
            f"local_pages holds {sequences} sequences and remote_pages {len(remote_starts)}; they must match")
    tokens = np.broadcast_to(np.asarray(num_tokens, dtype=np.int64), (sequences,))
    if sequences and tokens.min() < 0:
        bad = int(np.argmin(tokens))
        raise _kvcache.InvalidArgumentError(f"num_tokens[{bad}] is {int(tokens[bad])}; it must be >= 0")
    for name, counts, tokens_per_page in (("local_pages", local_counts, local_tokens_per_page),
                                          ("remote_pages", remote_counts, remote_tokens_per_page)):
        needed = -(-tokens // tokens_per_page)
        short = np.flatnonzero(counts < needed)
        if short.size:
            s = int(short[0])
            raise _kvcache.InvalidArgumentError(
                f"{name}[{s}] holds {int(counts[s])} pages; its {int(tokens[s])} tokens need {int(needed[s])}")
    runs = -(-tokens // run)
    total = int(runs.sum())
    if sequences == 1:
        sequence = np.zeros(total, dtype=np.int64)
        index = np.arange(total, dtype=np.int64)
    else:
        sequence = np.repeat(np.arange(sequences, dtype=np.int64), runs)
        index = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(runs) - runs, runs)
    result = []
    for name, flat, starts, tokens_per_page, num_pages in (
            ("local_pages", local_flat, local_starts, local_tokens_per_page, local_num_pages),
            ("remote_pages", remote_flat, remote_starts, remote_tokens_per_page, remote_num_pages)):
        per_page = tokens_per_page // run
        slot = index // per_page if per_page > 1 else index
        pages = flat[starts[sequence] + slot]
        bad = np.flatnonzero((pages < -1) | (pages >= num_pages))
        if bad.size:
            i = int(bad[0])
            raise _kvcache.OutOfRangeError(f"{name}[{int(sequence[i])}][{int(slot[i])}] is page {int(pages[i])}, "
                                           f"outside [0, {num_pages})")
        result.append((pages, pages * per_page + index % per_page if per_page > 1 else pages))
    (local_page, local), (remote_page, remote) = result
    held = (local_page != _kvcache.UNUSED_PAGE_ENTRY) & (remote_page != _kvcache.UNUSED_PAGE_ENTRY)
    if not held.all():
        local, remote = local[held], remote[held]
    return local, remote


def layer_indices(runs, blocks, descriptors_per_block):
    """The int32 indices into one layer's prepared list of `runs` (one side's descriptor_runs) in each of the layer's
    `blocks` blocks (its parts and halves), block by block: the order of transfer_descriptors' ranges."""
    return (np.arange(blocks, dtype=np.int64)[:, None] * descriptors_per_block + runs).astype(np.int32).ravel()


def joined_indices(layers, layer_starts, blocks_per_layer, shared):
    """One int32 list of the indices of `layers` (in order) into a group's whole prepared list: layer l's are
    layer_starts[l] (where its descriptors start) plus shared[blocks_per_layer[l]] (layer_indices for its block
    count). Layers next to each other with the same block count are done in one step."""
    pieces = []
    start = 0
    while start < len(layers):
        end = start + 1
        blocks = blocks_per_layer[layers[start]]
        while end < len(layers) and blocks_per_layer[layers[end]] == blocks:
            end += 1
        offsets = np.array([layer_starts[layer] for layer in layers[start:end]], dtype=np.int32)
        pieces.append((offsets[:, None] + shared[blocks][None, :]).ravel())
        start = end
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)


def _page_lists(pages):
    """`pages` (a list of page lists or a [sequences, pages] array) as one int64 array, each sequence's start in it
    and its page count."""
    if isinstance(pages, np.ndarray) and pages.ndim == 2:
        rows, width = pages.shape
        return (pages.astype(np.int64, copy=False).ravel(), np.arange(rows, dtype=np.int64) * width,
                np.full(rows, width, dtype=np.int64))
    lists = [np.asarray(p, dtype=np.int64).ravel() for p in pages]
    counts = np.array([len(p) for p in lists], dtype=np.int64)
    flat = np.concatenate(lists) if lists else np.zeros(0, dtype=np.int64)
    return flat, np.cumsum(counts) - counts, counts


class _PreparedList:
    """One side's prepared descriptor list of one page group, prepped with NIXL per layer (for a transfer per layer)
    and, on first use, whole (for a transfer of every layer)."""

    def __init__(self, agent, owner, description, group, tokens_per_descriptor, mem_type):
        self.agent = agent
        self.owner = owner
        self.mem_type = mem_type
        self.blocks, ends, self.num_pages, self.per_page = _kvcache.transfer_prepared_descriptors(
            description, group, tokens_per_descriptor)
        ends = [int(end) for end in ends]
        starts = [0] + ends[:-1]
        self.layer_rows = list(zip(starts, ends))
        self.layer_blocks = [end - start for start, end in self.layer_rows]
        self.per_block = self.num_pages * self.per_page  # descriptors of one block
        # Where each layer's descriptors start in the whole list.
        self.layer_starts = [start * self.per_block for start in starts]
        self.layers = [agent.prep_xfer_dlist(owner, np.ascontiguousarray(self.blocks[start:end]), mem_type)
                       for start, end in self.layer_rows]
        self._whole = None

    def whole(self):
        if self._whole is None:
            if len(self.blocks) * self.per_block > np.iinfo(np.int32).max:
                raise _kvcache.InvalidArgumentError(
                    f"the group's prepared list holds {len(self.blocks) * self.per_block} descriptors; NIXL indexes "
                    f"at most {np.iinfo(np.int32).max}: pull with per_layer=True")
            self._whole = self.agent.prep_xfer_dlist(self.owner, self.blocks, self.mem_type)
        return self._whole

    def release(self):
        for handle in self.layers + ([self._whole] if self._whole is not None else []):
            self.agent.release_dlist_handle(handle)
        self.layers = []
        self._whole = None


class _PreparedStateList:
    """One side's state slots as one prepared descriptor list: per state layer and tensor, a block of one descriptor
    per slot."""

    def __init__(self, agent, owner, description, mem_type):
        self.agent = agent
        self.blocks, _, self.num_slots = _kvcache.transfer_prepared_state_descriptors(description)
        self.handle = agent.prep_xfer_dlist(owner, self.blocks, mem_type) if len(self.blocks) else None

    def release(self):
        if self.handle is not None:
            self.agent.release_dlist_handle(self.handle)
            self.handle = None


class NixlPages:
    """A cache's memory registered with one NIXL agent, and the peers whose pages it pulls."""

    def __init__(self, agent, description, mem_type="VRAM"):
        """Registers the memory `description` (a transfer description's bytes) names with `agent` as `mem_type`
        ("VRAM" for a KVCacheManager's pools, "DRAM" for host memory)."""
        self.agent = agent
        self.description = bytes(description)
        self.mem_type = mem_type
        rows = _kvcache.transfer_registration(self.description)
        self._registration = agent.register_memory(
            [(int(address), int(size), int(device), "") for address, size, device in rows], mem_type)
        self._peers = {}
        # (owner, group, tokens per descriptor) -> _PreparedList, (owner, "states") -> _PreparedStateList; owner ""
        # for this cache
        self._lists = {}
        self._plans = {}  # (peers, group) -> (tokens per descriptor, per layer the peer it comes from whole, or -1)

    @classmethod
    def for_cache(cls, agent, cache, model_config=None, tp=1, rank=0):
        """Registers `cache` (a KVCacheManager) with `agent`; for rank `rank` of `tp`, `model_config` is the whole
        model's Config."""
        return cls(agent, cache.transfer_description(model_config, tp, rank), "VRAM")

    def metadata(self):
        """What the other side needs: this agent's metadata and this cache's description, both bytes."""
        return self.agent.get_agent_metadata(), self.description

    def add_peer(self, agent_metadata, description):
        """Adds the peer that sent `agent_metadata` and `description` (its metadata()); returns its agent name."""
        name = self.agent.add_remote_agent(agent_metadata)
        name = name.decode() if isinstance(name, bytes) else name
        self._peers[name] = bytes(description)
        return name

    def mismatch(self, peer, group):
        """"" when pages of `group` can move between this cache and `peer`'s, else why not."""
        return _kvcache.transfer_mismatch(self.description, self._peers[peer], group)

    def pull(self, peers, local_pages, remote_pages, group, num_tokens, notification=b"", per_layer=True):
        """Starts reading tokens [0, num_tokens) of one sequence of page group `group` from `peers` (agent names, in
        the order transfer_descriptors takes remotes: each local head comes from the first that holds it) into
        `local_pages`. `remote_pages` are the peers' page ids (the ranks of one tensor-parallel group hold the same
        ones). With `per_layer`, one NIXL transfer per peer and layer, so that each layer can be waited on as it lands;
        without, one per peer (fewer transfers to start; a layer is done when all are). Returns a PagePull;
        `notification` goes to every peer once all its layers landed."""
        return self.pull_many(peers, [local_pages], [remote_pages], group, [num_tokens], notification, per_layer)

    def pull_many(self, peers, local_pages, remote_pages, group, num_tokens, notification=b"", per_layer=True):
        """pull for several sequences at once, in the same transfers: local_pages[s], remote_pages[s] and
        num_tokens[s] (or num_tokens for all) are sequence s's (lists of lists or [sequences, pages] arrays)."""
        peers = list(peers)
        tokens_per_descriptor, sources = self._plan(peers, group)
        if min(sources, default=0) < 0:
            transfers = self._ranges(peers, local_pages, remote_pages, group, num_tokens, per_layer)
        else:
            transfers = self._prepared_transfers(peers, local_pages, remote_pages, group, num_tokens, per_layer,
                                                 tokens_per_descriptor, sources)
        return PagePull(self.agent, peers, transfers, notification)

    def pull_states(self, peer, local_slots, remote_slots, notification=b""):
        """Starts reading the states of sequences, every tensor of every state layer, from `peer`'s slots
        `remote_slots[i]` into this cache's slots `local_slots[i]`, in one NIXL transfer. Returns a PagePull of one
        step (wait_layer(0) or wait()). Raises InvalidArgumentError when the two caches' state layers differ
        (transfer_state_mismatch) or the lists are not pairs, OutOfRangeError for a slot outside either side's
        slots."""
        reason = _kvcache.transfer_state_mismatch(self.description, self._peers[peer])
        if reason:
            raise _kvcache.InvalidArgumentError(f"pull_states: {reason}")
        local_slots = np.asarray(local_slots, dtype=np.int64).ravel()
        remote_slots = np.asarray(remote_slots, dtype=np.int64).ravel()
        if local_slots.size != remote_slots.size:
            raise _kvcache.InvalidArgumentError(
                f"pull_states: local_slots holds {local_slots.size} slots and remote_slots {remote_slots.size}; "
                f"they are pairs")
        mine, theirs = self._state_list(""), self._state_list(peer)
        for name, slots, prepared in (("local_slots", local_slots, mine), ("remote_slots", remote_slots, theirs)):
            bad = np.flatnonzero((slots < 0) | (slots >= prepared.num_slots))
            if bad.size:
                raise _kvcache.OutOfRangeError(
                    f"pull_states: {name}[{bad[0]}] is slot {slots[bad[0]]}, outside [0, {prepared.num_slots})")
        if local_slots.size == 0 or mine.handle is None:
            return PagePull(self.agent, [peer], [[]], notification)
        blocks = np.arange(len(mine.blocks), dtype=np.int64)[:, None]
        local = (blocks * mine.num_slots + local_slots).astype(np.int32).ravel()
        remote = (blocks * theirs.num_slots + remote_slots).astype(np.int32).ravel()
        handle = self._start(peer, mine.handle, local, theirs.handle, remote)
        return PagePull(self.agent, [peer], [[(peer, handle)]], notification)

    def uses_prepared_lists(self, peers, group):
        """Whether pulls of `group` from `peers` name descriptors of prepared lists (False: some layer's heads come in
        tensor-parallel slices, and its pulls build ranges)."""
        return min(self._plan(list(peers), group)[1], default=0) >= 0

    def _plan(self, peers, group):
        key = (tuple(peers), group)
        if key not in self._plans:
            self._plans[key] = _kvcache.transfer_prepared_plan(self.description, [self._peers[p] for p in peers],
                                                               group)
        return self._plans[key]

    def _list(self, owner, group, tokens_per_descriptor):
        key = (owner, group, tokens_per_descriptor)
        if key not in self._lists:
            description = self.description if owner == "" else self._peers[owner]
            self._lists[key] = _PreparedList(self.agent, owner or _LOCAL_AGENT, description, group,
                                             tokens_per_descriptor, self.mem_type)
        return self._lists[key]

    def _state_list(self, owner):
        key = (owner, "states")
        if key not in self._lists:
            description = self.description if owner == "" else self._peers[owner]
            self._lists[key] = _PreparedStateList(self.agent, owner or _LOCAL_AGENT, description, self.mem_type)
        return self._lists[key]

    def _prepared_transfers(self, peers, local_pages, remote_pages, group, num_tokens, per_layer,
                            tokens_per_descriptor, sources):
        mine = self._list("", group, tokens_per_descriptor)
        theirs = {r: self._list(peers[r], group, tokens_per_descriptor) for r in set(sources)}
        remote = theirs[sources[0]]
        local_runs, remote_runs = descriptor_runs(
            local_pages, remote_pages, num_tokens, mine.per_page * tokens_per_descriptor,
            remote.per_page * tokens_per_descriptor, mine.num_pages, remote.num_pages)
        num_layers = len(sources)
        transfers = [[] for _ in range(num_layers)]
        if local_runs.size == 0:
            return transfers
        # A layer's index lists depend only on its block count (its parts and halves), so layers share them.
        local_indices, remote_indices = {}, {}
        for layer, r in enumerate(sources):
            blocks = mine.layer_blocks[layer]
            if blocks not in local_indices:
                local_indices[blocks] = layer_indices(local_runs, blocks, mine.per_block)
            if (r, blocks) not in remote_indices:
                remote_indices[(r, blocks)] = layer_indices(remote_runs, blocks, theirs[r].per_block)
        if per_layer:
            for layer, r in enumerate(sources):
                blocks = mine.layer_blocks[layer]
                handle = self._start(peers[r], mine.layers[layer], local_indices[blocks], theirs[r].layers[layer],
                                     remote_indices[(r, blocks)])
                transfers[layer].append((peers[r], handle))
            return transfers
        for r in sorted(set(sources)):
            layers = [layer for layer, source in enumerate(sources) if source == r]
            local_list, remote_list = mine.whole(), theirs[r].whole()
            local = joined_indices(layers, mine.layer_starts, mine.layer_blocks,
                                   {mine.layer_blocks[l]: local_indices[mine.layer_blocks[l]] for l in layers})
            remote = joined_indices(layers, theirs[r].layer_starts, mine.layer_blocks,
                                    {mine.layer_blocks[l]: remote_indices[(r, mine.layer_blocks[l])] for l in layers})
            handle = self._start(peers[r], local_list, local, remote_list, remote)
            for layer in range(num_layers):
                transfers[layer].append((peers[r], handle))
        return transfers

    def _start(self, peer, local_list, local_indices, remote_list, remote_indices):
        handle = self.agent.make_prepped_xfer("READ", local_list, local_indices, remote_list, remote_indices)
        if self.agent.transfer(handle) == "ERR":
            raise RuntimeError(f"NIXL could not start a transfer from {peer}")
        return handle

    def _ranges(self, peers, local_pages, remote_pages, group, num_tokens, per_layer):
        """The transfers of a pull from transfer_descriptors' ranges, per sequence, joined per peer and layer."""
        remotes = [self._peers[p] for p in peers]
        tokens = np.broadcast_to(np.asarray(num_tokens, dtype=np.int64), (len(local_pages),))
        per_sequence = [_kvcache.transfer_descriptors(self.description, mine, remotes, theirs, group, int(n))
                        for mine, theirs, n in zip(local_pages, remote_pages, tokens)]
        num_layers = max((len(ends) for ranges in per_sequence for _, _, ends in ranges), default=0)
        transfers = [[] for _ in range(num_layers)]
        spans = [(layer, layer) for layer in range(num_layers)] if per_layer else [(0, num_layers - 1)]
        for r, peer in enumerate(peers):
            rows = [(local, remote, [0] + [int(end) for end in ends])
                    for local, remote, ends in (ranges[r] for ranges in per_sequence)]
            for first, last in spans:
                local = np.concatenate([mine[bounds[first]:bounds[last + 1]] for mine, _, bounds in rows])
                if len(local) == 0:
                    continue
                remote = np.concatenate([theirs[bounds[first]:bounds[last + 1]] for _, theirs, bounds in rows])
                handle = self.agent.initialize_xfer("READ", self.agent.get_xfer_descs(local, self.mem_type),
                                                    self.agent.get_xfer_descs(remote, self.mem_type), peer)
                if self.agent.transfer(handle) == "ERR":
                    raise RuntimeError(f"NIXL could not start a transfer from {peer}")
                for layer in range(first, last + 1):
                    transfers[layer].append((peer, handle))
        return transfers

    def close(self):
        """Releases the prepared lists and deregisters the memory; the agent stays the caller's."""
        for prepared in self._lists.values():
            prepared.release()
        self._lists = {}
        if self._registration is not None:
            self.agent.deregister_memory(self._registration)
            self._registration = None


class PagePull:
    """The transfers of one pull: per layer of the group, one NIXL transfer per peer that sends some of it."""

    def __init__(self, agent, peers, transfers, notification):
        self._agent = agent
        self._peers = peers
        self._transfers = transfers
        self._notification = notification
        self._done = [not layer for layer in transfers]
        self._notified = False

    @property
    def num_layers(self):
        """Layers of the page group."""
        return len(self._transfers)

    def layer_done(self, layer):
        """Whether every transfer of `layer` (an index into the group's layers) has landed; raises RuntimeError when
        one failed."""
        if not self._done[layer]:
            finished = True
            for peer, handle in self._transfers[layer]:
                state = self._agent.check_xfer_state(handle)
                if state == "ERR":
                    raise RuntimeError(f"NIXL reports an error in the transfer of layer {layer} from {peer}")
                finished = finished and state == "DONE"
            self._done[layer] = finished
        return self._done[layer]

    def wait_layer(self, layer, timeout_s=60.0):
        """Waits until `layer` has landed; raises TimeoutError after `timeout_s` seconds."""
        deadline = time.monotonic() + timeout_s
        while not self.layer_done(layer):
            if time.monotonic() > deadline:
                raise TimeoutError(f"layer {layer} did not land within {timeout_s} s")

    def wait(self, timeout_s=60.0):
        """Waits until every layer has landed, then sends the notification to every peer and releases the transfer
        handles."""
        for layer in range(self.num_layers):
            self.wait_layer(layer, timeout_s)
        if not self._notified:
            handles = {id(handle): handle for layer in self._transfers for _, handle in layer}
            for handle in handles.values():
                self._agent.release_xfer_handle(handle)
            if self._notification:
                for peer in self._peers:
                    self._agent.send_notif(peer, self._notification)
            self._notified = True
