"""kvcache: the KV cache memory of an LLM inference runtime, from Python.

Each attention layer gets its own device buffer; views of it implement the DLPack protocol, so
``torch.from_dlpack(cache.pool_view(layer))`` shares the cache's memory without a copy. Page operations
(``cache.copy_pages``, ``cache.reset_pages``) take host lists or device arrays and run across all layers in one launch.
``HostTier`` keeps pages of one page group in pinned host memory (offload, onboard); ``save_sequence`` and
``load_sequence`` write them to sequence files and read them back. ``TieredPrefixCache`` wires a ``PageManager`` to one
host tier per page group: pages the device evicts go to the host, and ``admit`` brings a prompt's pages back. The
state layers of hybrid models keep one slot per sequence: ``cache.state_view(layer, name)`` is a tensor's every slot,
and ``PageManager.state_slots`` the slot table of a batch.
Importing this package needs neither torch nor NumPy.
"""

from . import _kvcache
from ._kvcache import *  # noqa: F403 (the names of _kvcache.__all__)

# The extension lists its public names (and __version__) itself, so that each is written once, in the binding.
__all__ = list(_kvcache.__all__)
