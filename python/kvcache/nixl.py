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

The ranges come from ``kvcache.transfer_descriptors`` (docs/transfer_descriptors.md): page sizes may differ by a
whole factor and tensor-parallel ranks may split heads differently.
"""

import time

from . import _kvcache


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
        ranges = _kvcache.transfer_descriptors(self.description, local_pages, [self._peers[p] for p in peers],
                                               remote_pages, group, num_tokens)
        num_layers = max((len(layer_ends) for _, _, layer_ends in ranges), default=0)
        transfers = [[] for _ in range(num_layers)]  # per layer: the (peer, handle) pairs it waits on
        for peer, (local, remote, layer_ends) in zip(peers, ranges):
            ends = [int(end) for end in layer_ends] if per_layer else [len(local)]
            start = 0
            for index, end in enumerate(ends):
                if end > start:
                    handle = self.agent.initialize_xfer("READ", self.agent.get_xfer_descs(local[start:end], self.mem_type),
                                                        self.agent.get_xfer_descs(remote[start:end], self.mem_type),
                                                        peer)
                    if self.agent.transfer(handle) == "ERR":
                        raise RuntimeError(f"NIXL could not start a transfer from {peer}")
                    for layer in ([index] if per_layer else range(num_layers)):
                        transfers[layer].append((peer, handle))
                start = end
        return PagePull(self.agent, list(peers), transfers, notification)

    def close(self):
        """Deregisters the memory; the agent stays the caller's."""
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
