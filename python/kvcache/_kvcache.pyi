"""
kvcache: per-layer KV cache memory, zero-copy DLPack views and page operations (C++ core).
"""

from collections.abc import Callable, Sequence
import enum
import os
from typing import Annotated, Any, Protocol, Union, overload

import numpy
from numpy.typing import NDArray


class _CudaStreamProtocol(Protocol):
    def __cuda_stream__(self) -> tuple[int, int]: ...

class _TorchStreamLike(Protocol):
    @property
    def cuda_stream(self) -> int: ...

StreamLike = Union[int, _CudaStreamProtocol, _TorchStreamLike]
"""A CUDA stream: an int handle, an object with __cuda_stream__() (the CUDA stream protocol) or with cuda_stream."""

DeviceArray = Any
"""An int32 array in device memory: any object with __dlpack__ (CUDA device) or __cuda_array_interface__."""

PagePairs = Union[Sequence[tuple[int, int]], Sequence[Sequence[int]], NDArray[Any], DeviceArray]
"""Page pairs (src, dst): a host sequence of pairs or [n, 2] int array, or a device int32 array ([n, 2] or [2n])."""

StatePairs = Union[Sequence[tuple[int, int]], Sequence[Sequence[int]], NDArray[Any]]
"""State slot pairs (src, dst): a host sequence of pairs or [n, 2] int array."""

PageIds = Union[Sequence[int], NDArray[Any], DeviceArray]
"""Page ids: a host sequence of ints or 1-D int array, or a device int32 array."""

HostTierEntries = Union[Sequence[tuple[int, int]], Sequence[Sequence[int]], NDArray[Any], DeviceArray]
"""(page, host_page) entries: a host sequence of pairs or [n, 2] int array, or a device int32 array ([n, 2] or [2n])."""

HostStateEntries = Union[Sequence[tuple[int, int]], Sequence[Sequence[int]], NDArray[Any]]
"""(slot, host_state) entries: a host sequence of pairs or [n, 2] int array."""

HostIds = Union[Sequence[int], NDArray[Any]]
"""Host page ids: a host sequence of ints or 1-D int array."""

PathLike = Union[str, os.PathLike[str]]
"""A file path: a str or an os.PathLike giving one."""

HostPageBuffers = Union[Sequence[Union[NDArray[Any], bytes, bytearray, memoryview]], NDArray[Any]]
"""Host buffers of one page each (C-contiguous, bytes_per_page bytes): a sequence of them or the rows of a 2-D array."""

class InvalidArgumentError(ValueError):
    """
    An argument broke a documented rule; the message names the field, the value and the limit.
    """

class InvalidConfigError(InvalidArgumentError):
    """
    A Config broke a rule; the message names the field, the value and the limit.
    """

class OutOfRangeError(IndexError):
    """A layer index, group or page id outside its range."""

class OutOfMemoryError(MemoryError):
    """Device memory or free pages could not be had."""

class CudaError(RuntimeError):
    """A CUDA runtime call failed."""

class DataType(enum.Enum):
    """Element types of a cache or a view."""

    FLOAT32 = 0

    FLOAT16 = 1

    BFLOAT16 = 2

    FP8_E4M3 = 3

    FP8_E5M2 = 4

    INT8 = 5

    UINT8 = 6

    INT32 = 7

    INT64 = 8

def data_type_size(dtype: DataType) -> int:
    """Returns the bytes of one element of `dtype`."""

def data_type_name(dtype: DataType) -> str:
    """Returns the printable name of `dtype` ('float16', 'fp8_e4m3', ...)."""

class KVLayerKind(enum.Enum):
    """What one attention layer caches per token."""

    KV = 0
    """K and V, each num_kv_heads x head_dim."""

    LATENT = 1
    """One latent vector of head_dim values, no V (MLA); 1 KV head."""

class KVQuantization(enum.Enum):
    """
    How a cache stores values and the scales it keeps beside them (docs/layout.md, Quantized pages).
    """

    NONE = 0
    """Values as kv_cache_type, no scales."""

    FP8_PER_TENSOR = 1
    """
    FP8 E4M3 values, one K and one V float scale a layer on the host: D bytes a token, head and half.
    """

    FP8_PER_TOKEN_HEAD = 2
    """
    FP8 E4M3 values and a float32 scale a (page, token, head), K and V: D + 4 bytes.
    """

    NVFP4 = 3
    """
    E2M1 values two a byte (uint8 storage) and an E4M3 scale a 16 values along D: D/2 + D/16 bytes.
    """

NVFP4_BLOCK_VALUES: int = 16

TOKENS_PER_PAGE: int = 128

MAX_TOKENS_PER_PAGE: int = 1024

MAX_NUM_PAGES: int = 1073741823

UNUSED_PAGE_ENTRY: int = -1

MAX_INLINE_PAGE_OPS: int = 256

MAX_INLINE_STATE_COPIES: int = 256

class KVLayerConfig:
    """Shape of one attention layer's cache."""

    def __init__(self, num_kv_heads: int, head_dim: int, sliding_window: int = 0, kind: KVLayerKind = KVLayerKind.KV) -> None: ...

    @property
    def num_kv_heads(self) -> int:
        """KV heads (1 for LATENT)."""

    @num_kv_heads.setter
    def num_kv_heads(self, arg: int, /) -> None: ...

    @property
    def head_dim(self) -> int:
        """Values a head and token."""

    @head_dim.setter
    def head_dim(self, arg: int, /) -> None: ...

    @property
    def sliding_window(self) -> int:
        """Tokens attended back over; 0 means full attention."""

    @sliding_window.setter
    def sliding_window(self, arg: int, /) -> None: ...

    @property
    def kind(self) -> KVLayerKind:
        """KV or LATENT."""

    @kind.setter
    def kind(self, arg: KVLayerKind, /) -> None: ...

    def __repr__(self) -> str: ...

    def __eq__(self, arg: object, /) -> bool: ...

class LayerScales:
    """
    A layer's host-held scales (KVCacheManager.layer_scales): the FP8_PER_TENSOR decode scales k_scale / v_scale (finite, >= 0) or the NVFP4 global decode scales of K and V (finite, > 0), float32. A latent layer has no V: its v is kept and unused. KVCacheManager.set_layer_scales checks them.
    """

    def __init__(self, k: float = 1.0, v: float = 1.0) -> None:
        """
        Both scales default to 1; a float beyond float32's range raises InvalidArgumentError.
        """

    @property
    def k(self) -> float:
        """K scale (float32)."""

    @k.setter
    def k(self, arg: float, /) -> None: ...

    @property
    def v(self) -> float:
        """V scale (float32; unused for a latent layer)."""

    @v.setter
    def v(self, arg: float, /) -> None: ...

    def __repr__(self) -> str: ...

    def __eq__(self, arg: object, /) -> bool: ...

MAX_STATE_DIMS: int = 7

STATE_TENSOR_ALIGNMENT: int = 256

class StateSplitSegment:
    """
    A run of a state tensor's split dimension: `parts` parts (heads, groups, channels) of `part_size` entries, split over the tensor-parallel ranks or, replicated, whole on every rank.
    """

    def __init__(self, parts: int, part_size: int = 1, replicated: bool = False, name: str = '') -> None:
        """Builds a segment; compute_layout checks it against its tensor's shape."""

    @property
    def parts(self) -> int:
        """Parts in the run; tp must divide it unless replicated."""

    @parts.setter
    def parts(self, arg: int, /) -> None: ...

    @property
    def part_size(self) -> int:
        """Entries one part spans; a part is never cut."""

    @part_size.setter
    def part_size(self, arg: int, /) -> None: ...

    @property
    def replicated(self) -> bool:
        """Whole on every rank instead of split."""

    @replicated.setter
    def replicated(self, arg: bool, /) -> None: ...

    @property
    def name(self) -> str:
        """What the parts are, for messages; may be empty."""

    @name.setter
    def name(self, arg: str, /) -> None: ...

    def __repr__(self) -> str: ...

    def __eq__(self, arg: object, /) -> bool: ...

class StateTensorConfig:
    """One named tensor of a state layer: one sequence's shape and its dtype."""

    def __init__(self, name: str, shape: Sequence[int], data_type: DataType = DataType.FLOAT32, *, split_dim: int = -1, split_segments: Sequence[StateSplitSegment] = []) -> None:
        """
        Builds a state tensor: a name unique in its layer, 1 to MAX_STATE_DIMS extents and a dtype; split_dim and split_segments say how tensor parallelism splits it (-1: whole on every rank).
        """

    @property
    def name(self) -> str:
        """Unique within its layer."""

    @name.setter
    def name(self, arg: str, /) -> None: ...

    @property
    def shape(self) -> list[int]:
        """One sequence's extents (a copy: assign a new list)."""

    @shape.setter
    def shape(self, arg: Sequence[int], /) -> None: ...

    @property
    def data_type(self) -> DataType:
        """Element type."""

    @data_type.setter
    def data_type(self, arg: DataType, /) -> None: ...

    @property
    def split_dim(self) -> int:
        """
        The dimension of shape tensor parallelism splits; -1 keeps the tensor whole on every rank.
        """

    @split_dim.setter
    def split_dim(self, arg: int, /) -> None: ...

    @property
    def split_segments(self) -> list[StateSplitSegment]:
        """
        split_dim's extent as consecutive segments (a copy: assign a new list); empty: one segment of one entry a part.
        """

    @split_segments.setter
    def split_segments(self, arg: Sequence[StateSplitSegment], /) -> None: ...

class StateLayerConfig:
    """
    A layer with a fixed-size state per sequence (Mamba, gated delta net, ...).
    """

    def __init__(self, tensors: Sequence[StateTensorConfig]) -> None:
        """Builds a state layer of at least one tensor."""

    @property
    def tensors(self) -> list[StateTensorConfig]:
        """Its tensors (a copy: assign a new list)."""

    @tensors.setter
    def tensors(self, arg: Sequence[StateTensorConfig], /) -> None: ...

class Config:
    """
    What a KVCacheManager allocates: one buffer per attention layer, each [2, num_pages, tokens_per_page, H_i, D_i]. Every field is checked by compute_layout(), which raises InvalidConfigError.
    """

    def __init__(self, *, layer_configs: Sequence[KVLayerConfig | tuple[Any, ...]] = [], num_attention_layers: int | None = None, max_batch_size: int = 0, max_sequence_length: int = 0, kv_cache_type: DataType = DataType.FLOAT16, num_pages: int = 0, tokens_per_page: int = 128, max_tokens_per_step: int = 0, num_pages_per_group: Sequence[int] = [], mem_pool: int = 0, quantization: KVQuantization = KVQuantization.NONE, state_layer_configs: Sequence[StateLayerConfig] = [], num_checkpoint_slots: int = 0) -> None:
        """
        Builds a config; layer_configs takes KVLayerConfig objects or (num_kv_heads, head_dim[, sliding_window[, kind]]) tuples, and num_attention_layers defaults to their number; state_layer_configs lists the state layers of a hybrid model.
        """

    @property
    def num_checkpoint_slots(self) -> int:
        """
        State slots beyond max_batch_size, kept for checkpoints; 0 without state layers.
        """

    @num_checkpoint_slots.setter
    def num_checkpoint_slots(self, arg: int, /) -> None: ...

    @property
    def state_layer_configs(self) -> list[StateLayerConfig]:
        """
        State layers (a copy: assign a new list to change them); each keeps num_state_slots slots of its tensors.
        """

    @state_layer_configs.setter
    def state_layer_configs(self, arg: Sequence[StateLayerConfig], /) -> None: ...

    @property
    def num_attention_layers(self) -> int:
        """Number of attention layers; must equal len(layer_configs)."""

    @num_attention_layers.setter
    def num_attention_layers(self, arg: int, /) -> None: ...

    @property
    def max_batch_size(self) -> int:
        """Sequences of the slot view."""

    @max_batch_size.setter
    def max_batch_size(self, arg: int, /) -> None: ...

    @property
    def max_sequence_length(self) -> int:
        """Tokens a sequence."""

    @max_sequence_length.setter
    def max_sequence_length(self, arg: int, /) -> None: ...

    @property
    def num_pages(self) -> int:
        """Pages per half and layer of a one-group cache; 0 means the minimum."""

    @num_pages.setter
    def num_pages(self, arg: int, /) -> None: ...

    @property
    def tokens_per_page(self) -> int:
        """Tokens a page: a power of two in [1, MAX_TOKENS_PER_PAGE]."""

    @tokens_per_page.setter
    def tokens_per_page(self, arg: int, /) -> None: ...

    @property
    def max_tokens_per_step(self) -> int:
        """
        The most tokens a sequence appends in one step; 0 means max_sequence_length.
        """

    @max_tokens_per_step.setter
    def max_tokens_per_step(self, arg: int, /) -> None: ...

    @property
    def kv_cache_type(self) -> DataType:
        """Element type of the cache."""

    @kv_cache_type.setter
    def kv_cache_type(self, arg: DataType, /) -> None: ...

    @property
    def quantization(self) -> KVQuantization:
        """
        How values are stored and scaled; FP8 formats need kv_cache_type FP8_E4M3, NVFP4 needs UINT8 and every head_dim a multiple of NVFP4_BLOCK_VALUES. KVCacheManager keeps the scales (scale_pool_view, layer_scales).
        """

    @quantization.setter
    def quantization(self, arg: KVQuantization, /) -> None: ...

    @property
    def layer_configs(self) -> list[KVLayerConfig]:
        """Per-layer shapes (a copy: assign a new list to change them)."""

    @layer_configs.setter
    def layer_configs(self, arg: Sequence[KVLayerConfig | tuple[Any, ...]], /) -> None: ...

    @property
    def num_pages_per_group(self) -> list[int]:
        """
        Pages per half of each page group's layers (0: the group's minimum); empty means every minimum.
        """

    @num_pages_per_group.setter
    def num_pages_per_group(self, arg: Sequence[int], /) -> None: ...

    @property
    def mem_pool(self) -> int:
        """
        cudaMemPool_t handle to allocate from; 0 means the device's current pool.
        """

    @mem_pool.setter
    def mem_pool(self, arg: int, /) -> None: ...

    def __repr__(self) -> str: ...

class KVLayerLayout:
    """Sizes of one layer's buffer (element counts per half)."""

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def kind(self) -> KVLayerKind: ...

    @property
    def sliding_window(self) -> int: ...

    @property
    def group(self) -> int: ...

    @property
    def num_halves(self) -> int: ...

    @property
    def slot_tokens(self) -> int: ...

    @property
    def num_pages(self) -> int: ...

    @property
    def page_elems(self) -> int: ...

    @property
    def page_bytes(self) -> int: ...

    @property
    def half_elems(self) -> int: ...

    @property
    def layer_bytes(self) -> int: ...

    @property
    def stored_dim(self) -> int: ...

    @property
    def scale_page_bytes(self) -> int: ...

    @property
    def scale_bytes(self) -> int: ...

class KVPageGroupLayout:
    """Layers that share one page-id space."""

    @property
    def sliding_window(self) -> int: ...

    @property
    def pages_per_sequence(self) -> int: ...

    @property
    def slot_tokens(self) -> int: ...

    @property
    def min_pages(self) -> int: ...

    @property
    def num_pages(self) -> int: ...

    @property
    def layers(self) -> list[int]: ...

    @property
    def bytes_per_page(self) -> int: ...

    @property
    def cache_bytes(self) -> int: ...

class StateTensorLayout:
    """
    One state tensor: [num_state_slots, ...shape] at offset_bytes of its layer.
    """

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> list[int]: ...

    @property
    def data_type(self) -> DataType: ...

    @property
    def slot_elems(self) -> int: ...

    @property
    def slot_bytes(self) -> int: ...

    @property
    def offset_bytes(self) -> int: ...

    @property
    def bytes(self) -> int: ...

class StateLayerLayout:
    """One state layer's allocation: its tensors one after another."""

    @property
    def tensors(self) -> list[StateTensorLayout]: ...

    @property
    def slot_bytes(self) -> int: ...

    @property
    def layer_bytes(self) -> int: ...

class KVCacheLayout:
    """The layout maths of a validated config."""

    @property
    def max_batch_size(self) -> int: ...

    @property
    def data_type(self) -> DataType: ...

    @property
    def tokens_per_page(self) -> int: ...

    @property
    def max_tokens_per_step(self) -> int: ...

    @property
    def cap_padded(self) -> int: ...

    @property
    def pages_per_slot(self) -> int: ...

    @property
    def min_pages(self) -> int: ...

    @property
    def num_pages(self) -> int: ...

    @property
    def element_bytes(self) -> int: ...

    @property
    def layers(self) -> list[KVLayerLayout]: ...

    @property
    def groups(self) -> list[KVPageGroupLayout]: ...

    @property
    def cache_bytes(self) -> int: ...

    @property
    def bytes_per_page(self) -> int: ...

    @property
    def quantization(self) -> KVQuantization: ...

    @property
    def num_state_slots(self) -> int: ...

    @property
    def num_checkpoint_slots(self) -> int: ...

    @property
    def state_layers(self) -> list[StateLayerLayout]: ...

    @property
    def state_bytes_per_slot(self) -> int: ...

    @property
    def state_bytes(self) -> int: ...

class BudgetSplit:
    """A budget split across page groups (split_budget)."""

    @property
    def sequences(self) -> int: ...

    @property
    def num_pages_per_group(self) -> list[int]: ...

    @property
    def bytes(self) -> int: ...

    @property
    def state_bytes(self) -> int: ...

def compute_layout(config: Config) -> KVCacheLayout:
    """
    Validates `config` and returns its layout; raises InvalidConfigError naming the field, value and limit. No GPU needed.
    """

def max_pages_for_budget(config: Config, budget_bytes: int) -> int:
    """
    Returns the largest num_pages whose cache fits in budget_bytes (one page group).
    """

def split_budget(config: Config, budget_bytes: int) -> BudgetSplit:
    """
    Splits budget_bytes across the page groups so each holds the same number of full-length sequences.
    """

class View:
    """
    A zero-copy view of kvcache memory implementing the DLPack protocol (torch.from_dlpack, cupy.from_dlpack, numpy.from_dlpack for host memory). It keeps the memory's owner alive, and so does every tensor made from it.
    """

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None, dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """
        Exports a DLPack capsule; `stream` is the consumer's stream, ordered after the cache's work by an event.
        """

    def __dlpack_device__(self) -> tuple:
        """Returns (DLPack device type, device id)."""

    @property
    def data_ptr(self) -> int:
        """Address of element (0, ..., 0)."""

    @property
    def shape(self) -> tuple:
        """Extents."""

    @property
    def strides(self) -> tuple:
        """Strides in elements."""

    @property
    def dtype(self) -> DataType:
        """Element type."""

    @property
    def ndim(self) -> int:
        """Number of dimensions."""

    @property
    def nbytes(self) -> int:
        """Bytes the view spans."""

    @property
    def owner(self) -> object:
        """The object that owns the memory."""

    def __repr__(self) -> str: ...

class KVHalf(enum.Enum):
    """Which half of each layer a page operation touches."""

    BOTH = 0

    K = 1

    V = 2

class PageOpTarget:
    """The page group, layers and halves a page operation touches."""

    def __init__(self, *, first_layer: int = 0, num_layers: int = -1, half: KVHalf = KVHalf.BOTH, group: int = -1) -> None: ...

    @property
    def first_layer(self) -> int:
        """First layer, a position in the group's layer list."""

    @first_layer.setter
    def first_layer(self, arg: int, /) -> None: ...

    @property
    def num_layers(self) -> int:
        """Layers from first_layer on; -1 means all."""

    @num_layers.setter
    def num_layers(self, arg: int, /) -> None: ...

    @property
    def half(self) -> KVHalf:
        """BOTH, K or V."""

    @half.setter
    def half(self, arg: KVHalf, /) -> None: ...

    @property
    def group(self) -> int:
        """Page group; -1 means the only one."""

    @group.setter
    def group(self, arg: int, /) -> None: ...

class LayerRef:
    """One layer's pools as a kernel addresses them (addresses as ints)."""

    @property
    def k_pool(self) -> int: ...

    @property
    def v_pool(self) -> int: ...

    @property
    def page_stride(self) -> int: ...

    @property
    def token_stride(self) -> int: ...

    @property
    def head_stride(self) -> int: ...

    @property
    def element_bytes(self) -> int: ...

    @property
    def num_pages(self) -> int: ...

    @property
    def tokens_per_page(self) -> int: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

class KVCacheManager:
    """
    Owns one device buffer per attention layer (cudaMallocAsync on its stream) and hands out zero-copy DLPack views of it. Views and the tensors made from them keep the manager alive.
    """

    def __init__(self, config: Config, stream: StreamLike | None = None) -> None:
        """
        Validates `config` (InvalidConfigError) and allocates the cache on `stream` (int handle or object with __cuda_stream__ / cuda_stream, kept referenced; None creates a non-blocking stream the manager owns) on the current device. Raises OutOfMemoryError when the memory cannot be had.
        """

    def pool_view(self, layer: int) -> View:
        """
        Pool view [2, num_pages, tokens_per_page, H, D] ([1, ...] for a latent layer).
        """

    def slot_view(self, layer: int) -> View:
        """
        Slot view [2, max_batch_size, slot_tokens, H, D]; raises InvalidConfigError when the layer's group has retained pages.
        """

    def k_pool(self, layer: int) -> View:
        """K pool [num_pages, tokens_per_page, H, D] of a layer."""

    def v_pool(self, layer: int) -> View:
        """
        V pool [num_pages, tokens_per_page, H, D]; raises InvalidArgumentError for a latent layer.
        """

    def separate_view(self, layer: int) -> tuple[View, View]:
        """
        K and V views, each [max_batch_size, slot_tokens, H, D] (V empty for a latent layer).
        """

    def state_view(self, layer: int, tensor: int | str) -> View:
        """
        Tensor `tensor` (its index in the layer, or its name) of state layer `layer`, zero-copy: [num_state_slots,
        *shape], contiguous, in the tensor's dtype. Row n is state slot n (PageManager.state_slot): one sequence's
        state, or a checkpoint's. State memory starts uninitialized. Raises OutOfRangeError for a bad layer or tensor
        index, InvalidArgumentError naming the layer's tensors for an unknown name.
        """

    def transfer_description(self, model_config: Config | None = None, tp: int = 1, rank: int = 0) -> bytes:
        """
        This cache's transfer description as bytes, to send to the other side of a page transfer: its device, pools, geometry and host-held scales, and for rank `rank` of `tp` (model_config: the whole model's Config) the heads it holds (docs/transfer_descriptors.md).
        """

    def scale_pool_view(self, layer: int) -> View:
        """
        Scale pool view of a layer, zero-copy, K scales then V scales (view[0], view[1]), as FlashInfer's kv_cache_sf:
        [num_halves, num_pages, tokens_per_page, H] float32 (FP8_PER_TOKEN_HEAD: a scale a page, token and head) or
        [num_halves, num_pages, tokens_per_page, H, head_dim / 16] FP8 E4M3 (NVFP4: a block scale a 16 values);
        num_halves is 1 for a latent layer. Raises OutOfRangeError for a bad index and InvalidArgumentError, naming
        the quantization, for a cache without scale pools.
        """

    def layer_scales(self, layer: int) -> LayerScales:
        """
        A copy of the layer's host-held scales: FP8_PER_TENSOR's K and V decode scales or NVFP4's global scales, 1.0
        until set (a latent layer's v is unused). Raises OutOfRangeError for a bad index and InvalidArgumentError,
        naming the quantization, unless it is FP8_PER_TENSOR or NVFP4.
        """

    def set_layer_scales(self, layer: int, scales: LayerScales) -> None:
        """
        Sets the layer's host-held scales (FP8_PER_TENSOR: finite, >= 0; NVFP4: finite, > 0), which later writes
        quantize with and sequence files record. Raises as layer_scales does, and InvalidArgumentError naming the
        scale, its value and the limit; a refused call changes nothing.
        """

    def k_pool_ptr(self, layer: int) -> int:
        """Address of the layer's K pool."""

    def v_pool_ptr(self, layer: int) -> int:
        """Address of the layer's V pool (0 for a latent layer)."""

    def layer_ref(self, layer: int) -> LayerRef:
        """The layer's pools as a kernel addresses them."""

    def get_layer_config(self, layer: int) -> KVLayerConfig:
        """The layer's shape."""

    def group(self, group: int) -> KVPageGroupLayout:
        """Page group `group`'s layout."""

    def group_of(self, layer: int) -> int:
        """The page group of a layer."""

    def num_pages(self) -> int:
        """Pages per half of group 0."""

    def min_pages(self) -> int:
        """Group 0's minimum pages."""

    def get_config(self) -> Config:
        """A copy of the config."""

    def layout(self) -> KVCacheLayout:
        """A copy of the layout."""

    def stream(self) -> int:
        """The cache's stream handle."""

    def device(self) -> int: ...

    def synchronize(self) -> None:
        """Waits on the host for the work enqueued on the cache's stream."""

    def copy_pages(self, pairs: PagePairs, stream: StreamLike | None = None, *, target: PageOpTarget | None = None, group: int | None = None, count: DeviceArray | None = None, error_count: DeviceArray | None = None) -> None:
        """
        Copies each (src, dst) page in every targeted layer and half, stream-ordered (default: the cache's stream).
        pairs: a host list (sequence of pairs, [n, 2] int array) validated before launch, or a device int32 array
        ([n, 2] or [2n], __dlpack__ or __cuda_array_interface__) read by the kernel, so a CUDA graph that captured
        the call replays with its current contents; count / error_count: optional one-element device int32 arrays
        (device lists only). stream: int handle or object with __cuda_stream__ / cuda_stream.
        """

    def copy_states(self, pairs: StatePairs, stream: StreamLike | None = None) -> None:
        """
        Copies each (src, dst) state slot in every state layer and tensor, all in one launch (per
        MAX_INLINE_STATE_COPIES pairs), stream-ordered (default: the cache's stream): a fork's state copies
        (PageManager.last_state_copies()) before the step's kernels. pairs: a host list (sequence of pairs, [n, 2]
        int array), checked before anything is launched: OutOfRangeError for a slot outside [0, num_state_slots),
        InvalidArgumentError for a destination listed twice, a slot both source and destination, a cache without state
        layers or a device array. stream: int handle or object with __cuda_stream__ / cuda_stream.
        """

    def reset_pages(self, pages: PageIds, stream: StreamLike | None = None, *, pattern: int = 0, target: PageOpTarget | None = None, group: int | None = None, count: DeviceArray | None = None, error_count: DeviceArray | None = None) -> None:
        """
        Fills each listed page with the 4-byte little-endian pattern (0 clears) in every targeted layer and half;
        pages as for copy_pages (host list or device int32 array).
        """

    def num_layers(self) -> int: ...

    def max_cap_padded(self) -> int: ...

    def tokens_per_page(self) -> int: ...

    def num_groups(self) -> int: ...

    def num_state_layers(self) -> int: ...

    def num_state_slots(self) -> int: ...

    def is_uniform(self) -> bool: ...

    def allocated_bytes(self) -> int: ...

    def calibrate_layer_scales(self, layer: int, observed: LayerWriteCounters) -> None:
        """
        Sets the layer's host-held scales from `observed` (a LayerWriteCounters, e.g. WriteCounters.read()[layer]) by calibrated_scales; a latent layer's v is kept. Raises as calibrated_scales and set_layer_scales do; a refused call changes nothing.
        """

    def attention_arguments(self, layer: int) -> dict:
        """
        What an attention kernel takes for the layer's quantization, as a dict (docs/flashinfer.md): `quantization`; `k_scale` / `v_scale`, the factors every K / V value is multiplied by after its page scale (FP8_PER_TENSOR's scales, NVFP4's global scales; 1.0 otherwise and for a latent layer's V); `k_scale_pool` / `v_scale_pool`, the scale pool's K and V halves as zero-copy views (FlashInfer's kv_cache_sf; None without page scales, and V for a latent layer); `token_head_scales` (FlashInfer's use_token_head_sf); `tensor_core_decode`: only a tensor-core decode reads the page scales. The scales are a copy taken now. Raises OutOfRangeError for a bad index.
        """

    def latent_pool_view(self, layer: int) -> View:
        """
        View [num_pages, tokens_per_page, head_dim] of latent layer `layer`'s pool, as MLA kernels take it: each token's kv_lora_rank values, then its rope part. Raises for a KV layer.
        """

class PageAllocator:
    """
    Page ids of one page group on the host: an O(1) LIFO free list and a reference count per page. Every rejected call raises before it changes anything.
    """

    def __init__(self, num_pages: int) -> None: ...

    def num_pages(self) -> int: ...

    def num_free(self) -> int: ...

    def num_used(self) -> int: ...

    @overload
    def allocate(self) -> int:
        """
        Returns a free page (the most recently freed), now with reference count 1; raises OutOfMemoryError when none is free.
        """

    @overload
    def allocate(self, count: int) -> list[int]:
        """
        Returns `count` free pages, all or nothing (OutOfMemoryError naming the pages needed and free).
        """

    def allocate_into(self, out: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu')]) -> None:
        """
        Fills `out`, a writable one-dimensional C-contiguous int32 host array, with free pages, all or nothing; allocates nothing. Raises InvalidArgumentError (a ValueError) for another dtype, layout or device, TypeError for what is no array, before taking a page.
        """

    def retain(self, page: int) -> None:
        """Adds a holder to a used page."""

    def release(self, pages: PageIds) -> None:
        """
        Releases one page (an int) or each page of a list once, all or nothing; a page at count 0 is free.
        """

    def ref_count(self, page: int) -> int:
        """Reference count of a page, 0 when free."""

    def check_invariants(self) -> None:
        """Raises RuntimeError describing the first broken invariant."""

class PageTableBuffers:
    """
    Device page tables of one page group (CSR: indptr, indices, last_page_len; dense block table) at device addresses that never change, so a captured CUDA graph keeps reading them. Views of them keep this object alive.
    """

    def __init__(self, max_batch_size: int, max_pages_per_sequence: int, tokens_per_page: int, stream: StreamLike | None = None) -> None:
        """
        Allocates the tables on the current device and uploads those of count 0.
        """

    def build(self, sequences: Sequence[tuple[PageIds, int]], stream: StreamLike | None = None) -> None:
        """
        Builds the tables of `sequences`, each a (pages, num_tokens) pair (pages: ints or an int array), and enqueues one upload on `stream` (default: the constructor's). All or nothing (InvalidArgumentError).
        """

    def indptr(self) -> View:
        """Device view of the CSR row pointers [max_batch_size + 1] (int32)."""

    def indices(self) -> View:
        """
        Device view of the CSR page ids [max_batch_size * max_pages_per_sequence] (int32; indptr[count] in use).
        """

    def last_page_len(self) -> View:
        """
        Device view of the tokens in each sequence's last page [max_batch_size] (int32).
        """

    def block_table(self) -> View:
        """
        Device view of the dense block table [max_batch_size, max_pages_per_sequence] (int32, UNUSED_PAGE_ENTRY padding).
        """

    def host_indptr(self) -> list[int]:
        """A copy of the staged indptr of the last build."""

    def host_indices(self) -> list[int]:
        """A copy of the staged page ids in use of the last build."""

    def host_last_page_len(self) -> list[int]:
        """A copy of the staged last-page lengths of the last build."""

    def host_block_table(self) -> list[int]:
        """
        A copy of the staged block table of the last build, flattened row-major.
        """

    def count(self) -> int: ...

    def max_batch_size(self) -> int: ...

    def max_pages_per_sequence(self) -> int: ...

    def tokens_per_page(self) -> int: ...

    def upload_bytes(self) -> int: ...

    def first_token(self) -> View:
        """
        Device view of each row's first token position [max_batch_size] (int32): the pages a window released times tokens_per_page, 0 for full attention.
        """

    def resident_tokens(self) -> View:
        """
        Device view of the tokens each row holds from its first token on [max_batch_size] (int32): kernels' seq_lens / kv_len.
        """

    def host_first_token(self) -> list[int]:
        """A copy of the staged first tokens of the last build."""

    def host_resident_tokens(self) -> list[int]:
        """A copy of the staged resident token counts of the last build."""

class PageHashAlgorithm(enum.Enum):
    """The hash of page contents."""

    SHA256 = 0
    """Collision resistant (the default)."""

    XXH3_128 = 1
    """Faster; only for trusted prompts."""

class PageGroupCounts:
    """Pages of one page group, by state."""

    @property
    def num_pages(self) -> int: ...

    @property
    def free(self) -> int: ...

    @property
    def used(self) -> int: ...

    @property
    def cached(self) -> int: ...

    @property
    def shared(self) -> int: ...

class PageManagerStats:
    """Prefix reuse and copy-on-write counters."""

    @property
    def prefix_query_tokens(self) -> int: ...

    @property
    def prefix_hit_tokens(self) -> int: ...

    @property
    def evicted_pages(self) -> int: ...

    @property
    def copy_on_write_pages(self) -> int: ...

    @property
    def checkpoints_saved(self) -> int:
        """
        State checkpoints made: copies into a checkpoint slot queued by checkpoint_state.
        """

    @property
    def checkpoints_restored(self) -> int:
        """State checkpoints restored by adopt_prefix."""

    @property
    def checkpoints_dropped(self) -> int:
        """
        State checkpoints dropped: their slot reused, or their carrier page evicted.
        """

class PageManager:
    """
    The page lifecycle of one cache on the host: pages per sequence and group, forks with copy-on-write, prefix reuse through chained page hashes, LRU eviction. It never touches the GPU: run the copies step() returns with copy_pages before the step's kernels, and build PageTableBuffers from pages(sequence, group).
    """

    def __init__(self, source: KVCacheManager | KVCacheLayout | Config, *, max_sequences: int = 0, enable_prefix_caching: bool = True, hash_algorithm: PageHashAlgorithm = PageHashAlgorithm.SHA256, hash_seed: bytes | None = None, record_events: bool = False, checkpoint_interval_pages: int = 0) -> None:
        """
        Sized from `source`: a KVCacheManager (its layout()), a KVCacheLayout, or a Config (compute_layout); max_sequences 0 means the layout's max_batch_size; hash_seed: 32 bytes, or None for a random one; record_events: record KV events for take_events(); checkpoint_interval_pages: with state checkpoints, also ask for one every this many pages of a sequence (checkpoint_boundary), 0 for none but the prompt's and the match's. Raises InvalidArgumentError for max_sequences or checkpoint_interval_pages below 0.
        """

    def create(self, salt: bytes | None = None) -> int:
        """Returns a new empty sequence; `salt` (bytes) separates prefix reuse."""

    def adopt_prefix(self, sequence: int, tokens: PageIds, extra_keys: Sequence[tuple[int, int, int]] | None = None) -> int:
        """
        Gives an empty sequence the longest cached prefix of `tokens` (whole pages, at most len(tokens) - 1 tokens); returns its length in tokens. With state layers the prefix must also end at a state checkpoint, whose restore (checkpoint slot to the sequence's slot) it queues (pending_state_copies); without checkpoint slots such a layout adopts nothing.
        """

    def hash_next_pages(self, sequence: int, tokens: PageIds, extra_keys: Sequence[tuple[int, int, int]] | None = None) -> list[tuple[int, int]]:
        """
        Returns, as (lo, hi) tuples, the hashes the full pages of `tokens` would be registered under if appended to the sequence now (its length a whole number of pages); the eviction callback reports the same hashes, so a prefix evicted to another tier can be found and onboarded.
        """

    def append(self, sequence: int, tokens: PageIds, extra_keys: Sequence[tuple[int, int, int]] | None = None) -> list[list[tuple[int, int]]]:
        """
        Appends tokens to one sequence (step() with one entry); returns its copies as step() does. Raises InvalidArgumentError while a TieredPrefixCache serves the manager (append through its step()).
        """

    def step(self, appends: Sequence[tuple[int, PageIds] | tuple[int, PageIds, Sequence[tuple[int, int, int]]]]) -> list[list[tuple[int, int]]]:
        """
        Appends tokens to each listed sequence, all or nothing: appends is a list of (sequence, tokens[, extra_keys]). Returns the copies to run with copy_pages before the step's kernels: one list of (src, dst) per group, in order. Raises OutOfMemoryError naming the group, the pages needed and available, and InvalidArgumentError while a TieredPrefixCache serves the manager (step through it: it offloads the pages a step evicts before the step's kernels overwrite them).
        """

    def pages_needed(self, appends: Sequence[tuple[int, PageIds] | tuple[int, PageIds, Sequence[tuple[int, int, int]]]]) -> list[int]:
        """
        Returns, per group, the pages step(appends) would take less those its window releases make available; changes nothing. Raises what step() raises for invalid input.
        """

    def can_step(self, appends: Sequence[tuple[int, PageIds] | tuple[int, PageIds, Sequence[tuple[int, int, int]]]]) -> bool:
        """
        Returns whether step(appends) would succeed (False exactly when it would raise OutOfMemoryError); changes nothing.
        """

    def fork(self, parent: int) -> int:
        """
        Returns a new sequence sharing every page of `parent`; with state layers, in a state slot of its own, a copy of the parent's state queued for the next step (last_state_copies() after it).
        """

    def free(self, sequence: int) -> None:
        """
        Lets go of every page of `sequence`, frees its state slot and forgets it.
        """

    def state_slot(self, sequence: int) -> int:
        """
        Returns the state slot `sequence` holds from create or fork to free: an index into the first dimension of every state tensor [num_state_slots, ...], or -1 when the layout has no state layers.
        """

    def state_slots(self, sequences: Sequence[int]) -> list[int]:
        """
        Returns the state slot of each sequence, in order: a batch's slot table (vLLM's state_indices), to copy into a fixed int32 device buffer the step's recurrent kernels read.
        """

    def pending_state_copies(self) -> list[tuple[int, int]]:
        """
        The state copies (source slot, destination slot) queued since the last step by fork, checkpoint_state (the sequence's slot into a checkpoint slot) and adopt_prefix (a checkpoint slot into the sequence's), which the next step hands out.
        """

    def last_state_copies(self) -> list[tuple[int, int]]:
        """
        The state copies (source slot, destination slot) the latest step() or append() handed out: the forks, checkpoint saves and restores since the step before. Run them, in any order, before the step's kernels, in every state layer and tensor (slot dst of each [num_state_slots, ...] tensor takes slot src's bytes).
        """

    def checkpoint_boundary(self, sequence: int) -> int:
        """
        Returns the next length, above the sequence's, at which the manager asks for its state to be saved: the end of the prompt's last whole page before its last token, the end of the run of pages adopt_prefix found cached past what it adopted, or the next multiple of checkpoint_interval_pages pages; -1 for none (always -1 without state layers, checkpoint slots or prefix caching). End the prefill chunk there, run the step, then call checkpoint_state. Raises InvalidArgumentError for an unknown sequence.
        """

    def checkpoint_state(self, sequence: int) -> bool:
        """
        Keeps the sequence's state after its length tokens (in its state slot once the queued copies into it ran) as the checkpoint of its prefix: queues the copy of its slot into a checkpoint slot for the next step (pending_state_copies), an empty slot first, else the one a clock of hit counts picks. Returns True when the prefix has a checkpoint now (made, or there already), False when none could be kept (no checkpoint slots or prefix caching, its last page not registered, every checkpoint slot read or filled by a queued copy). Raises InvalidArgumentError for an unknown sequence, a layout without state layers, or a length that is 0 or not whole pages, changing nothing.
        """

    def checkpoint_slot(self, hash: tuple[int, int]) -> int:
        """
        Returns the state slot holding the checkpoint of the prefix whose last page has `hash` ((lo, hi), as hash_next_pages gives it), adoptable or still filling, or -1.
        """

    def num_checkpoints(self) -> int:
        """Returns the number of state checkpoints held."""

    def contains(self, sequence: int) -> bool: ...

    def length(self, sequence: int) -> int: ...

    def pages(self, sequence: int, group: int) -> tuple[list[int], int]:
        """
        Returns (page ids in token order, UNUSED_PAGE_ENTRY where a window released them; length in tokens): what PageTableBuffers.build takes.
        """

    def last_copies(self) -> list[list[tuple[int, int]]]:
        """
        The copies of the latest step() or append(), as it returned them (for a step whose eviction callback raised).
        """

    def evict_cached(self, group: int, count: int) -> int:
        """
        Drops up to `count` cached pages of `group`; returns how many. With a TieredPrefixCache serving the manager, its next call offloads them (or call its evict_cached).
        """

    def set_retention(self, sequence: int, first_token: int, end_token: int, priority: int, duration_ms: int | None = None) -> None:
        """
        Sets retention priority `priority` (0 to 100, default 35) on the pages `sequence` holds for tokens [first_token, end_token): a page's priority is the highest its holders set since it was last free, and cached pages are evicted lowest priority first, least recently released first within one. With duration_ms the priority holds that many milliseconds (steady clock), taking effect at the next step, append or evict_cached after it ends. Raises InvalidArgumentError for an unknown sequence, a priority outside [0, 100], a duration outside [0, one year] or a range past the sequence, changing nothing.
        """

    def retention_priority(self, group: int, page: int) -> int:
        """
        The retention priority of `page` of `group` (set_retention). Raises OutOfRangeError for a bad group or page.
        """

    def set_eviction_callback(self, callback: Callable[[int, int, tuple[int, int]], None] | None) -> None:
        """
        callback(group, page, (lo, hi)) for each evicted page, after the eviction completed; None removes it. What it raises propagates from the call that evicted (the first exception when it raises for several pages), the manager consistent and the call's other changes made. The manager takes part in garbage collection, so a callback that refers back to it does not keep it alive. Raises InvalidArgumentError while a TieredPrefixCache serves the manager (it owns the callback until it is destroyed).
        """

    def counts(self, group: int) -> PageGroupCounts: ...

    def stats(self) -> PageManagerStats: ...

    def reset_stats(self) -> None: ...

    def take_events(self) -> list:
        """
        The KV events recorded since the last call (record_events=True; none otherwise), in order, as dicts with vLLM's names: type ('BlockStored', 'BlockRemoved' or 'AllBlocksCleared'), medium, group_idx, block_hashes (16 bytes each), and for BlockStored parent_block_hash (bytes or None), token_ids, block_size and extra_keys (None, or per page None or a list of bytes: the salt on a sequence's first page, then each extra key's 20 bytes).
        """

    def counters(self) -> dict:
        """
        One snapshot of the counters as a dict: prefix_query_tokens, prefix_hit_tokens (by tier), evicted_pages (by tier), copy_on_write_pages, and tenants (a list of dicts: salt, other, query_tokens, device_hit_tokens, host_hit_tokens, disk_hit_tokens).
        """

    def prometheus_text(self, prefix: str = 'kvcache') -> str:
        """
        The counters in Prometheus' text exposition format, every metric named <prefix>_..._total.
        """

    def check_invariants(self) -> None:
        """Raises RuntimeError describing the first broken invariant."""

    def num_groups(self) -> int: ...

    def layout(self) -> KVCacheLayout: ...

    def max_sequences(self) -> int: ...

    def num_sequences(self) -> int: ...

class StepArguments:
    """
    A step's kernel arguments for every page group (token positions, qo_indptr, the token count, each entry's state slot, and per group CSR indptr / indices / last_page_len / first_token / resident_tokens and the block table, windowed groups at their own width), built from the step's entries in one call and one upload, at device addresses that never change. Views of them keep this object alive; views are sized to the last build unless full=True.
    """

    def __init__(self, manager: PageManager, max_batch_size: int, max_tokens_per_step: int, stream: StreamLike | None = None) -> None:
        """
        Sizes the arguments for the manager's page groups and uploads those of an empty step.
        """

    def build(self, entries: Sequence[tuple[int, PageIds | int] | tuple[int, PageIds, Sequence[tuple[int, int, int]]]], stream: StreamLike | None = None) -> None:
        """
        Builds the arguments of the step `entries` (what PageManager.step took: (sequence, tokens[, extra_keys]), or (sequence, token count)), called after that step, and enqueues one upload on `stream` (default: the constructor's). Row b is entry b; an entry of 0 tokens has table rows and no query tokens. All or nothing (InvalidArgumentError).
        """

    def positions(self, *, full: bool = False) -> View:
        """
        Device view of the (row, position) pairs [token_count, 2] (int32) write_tokens_paged takes; full: [max_tokens_per_step, 2], rows past token_count (-1, 0), which the write skips.
        """

    def qo_indptr(self, *, full: bool = False) -> View:
        """
        Device view of qo_indptr [count + 1] (int32; full: max_batch_size + 1).
        """

    def token_count(self) -> View:
        """
        Device view of the step's token count [1] (int32), for write_tokens_paged's count.
        """

    def state_slots(self, *, full: bool = False) -> View:
        """
        Device view of each entry's state slot [count] (int32; full: max_batch_size, rows past count -1): PageManager.state_slot of the entry's sequence, the state_indices of batched recurrent kernels. -1 in every row for a layout without state layers.
        """

    def indptr(self, group: int, *, full: bool = False) -> View:
        """
        Device view of group `group`'s CSR row pointers [count + 1] (int32; full: max_batch_size + 1).
        """

    def indices(self, group: int, *, full: bool = False) -> View:
        """
        Device view of group `group`'s CSR page ids in use [indptr[count]] (int32; full: the whole room).
        """

    def last_page_len(self, group: int, *, full: bool = False) -> View:
        """
        Device view of group `group`'s tokens in each row's last page [count] (int32; full: max_batch_size).
        """

    def first_token(self, group: int, *, full: bool = False) -> View:
        """
        Device view of group `group`'s first token of each row [count] (int32; full: max_batch_size): the pages a window released times tokens_per_page.
        """

    def resident_tokens(self, group: int, *, full: bool = False) -> View:
        """
        Device view of group `group`'s tokens each row holds [count] (int32; full: max_batch_size): kernels' seq_lens / kv_len.
        """

    def block_table(self, group: int, *, full: bool = False) -> View:
        """
        Device view of group `group`'s dense block table [count, max_pages_per_sequence(group)] (int32, UNUSED_PAGE_ENTRY padding; full: max_batch_size rows).
        """

    def host_positions(self) -> list[int]:
        """
        A copy of the staged positions of the last build, flattened: 2 * max_tokens_per_step values.
        """

    def host_qo_indptr(self) -> list[int]:
        """A copy of the staged qo_indptr of the last build [max_batch_size + 1]."""

    def host_state_slots(self) -> list[int]:
        """
        A copy of the staged state slots of the last build [max_batch_size], -1 past count.
        """

    def host_indptr(self, group: int) -> list[int]:
        """A copy of group `group`'s staged indptr [max_batch_size + 1]."""

    def host_last_page_len(self, group: int) -> list[int]:
        """A copy of group `group`'s staged last-page lengths [max_batch_size]."""

    def host_first_token(self, group: int) -> list[int]:
        """A copy of group `group`'s staged first tokens [max_batch_size]."""

    def host_resident_tokens(self, group: int) -> list[int]:
        """
        A copy of group `group`'s staged resident token counts [max_batch_size].
        """

    def host_indices(self, group: int) -> list[int]:
        """A copy of group `group`'s staged page ids in use."""

    def host_block_table(self, group: int) -> list[int]:
        """A copy of group `group`'s staged block table, flattened row-major."""

    def count(self) -> int: ...

    def host_token_count(self) -> int: ...

    def num_groups(self) -> int: ...

    def max_batch_size(self) -> int: ...

    def max_tokens_per_step(self) -> int: ...

    def tokens_per_page(self) -> int: ...

    def max_pages_per_sequence(self, group: int) -> int: ...

    def upload_bytes(self) -> int: ...

def write_tokens(cache: KVCacheManager, layer: int, k: DeviceArray, v: DeviceArray | None, token_addresses: DeviceArray, stream: StreamLike | None = None, *, count: DeviceArray | None = None, error_count: DeviceArray | None = None, group: int = -1, counters: WriteCounters | None = None) -> None:
    """
    Writes k and v ([n, num_kv_heads, head_dim] CUDA tensors of float32, float16 or bfloat16, any strides with the last dimension contiguous; v None for a latent layer) into layer `layer`'s pages at `token_addresses` (CUDA int64 [n]: page * tokens_per_page + offset; negative skips the token), converting to the cache's type (a quantized cache: quantized by docs/layout.md's rules, head_dim a multiple of 16, scales written where scale_pool_view shows them), in one launch on `stream` (default: the cache's). `count` (CUDA int32 [1]) limits the tokens on the device; `error_count` (CUDA int32 [1]) counts addresses past the layer's pages; `group` checks the addresses' page group; `counters` (a WriteCounters of this cache, quantized caches only) records the layer's amax and saturated values (docs/layout.md, "Calibration"). Graph-capturable.
    """

def write_tokens_paged(cache: KVCacheManager, layer: int, k: DeviceArray, v: DeviceArray | None, indptr: DeviceArray, indices: DeviceArray, first_token: DeviceArray | None, positions: DeviceArray, stream: StreamLike | None = None, *, count: DeviceArray | None = None, error_count: DeviceArray | None = None, group: int = -1, counters: WriteCounters | None = None) -> None:
    """
    As write_tokens, each token placed by its (sequence, position) row of `positions` (CUDA int32 [n, 2]) in the CSR table indptr / indices / first_token of the layer's group (as PageTableBuffers builds them; first_token None means 0). Positions outside a row's pages are counted in error_count.
    """

def read_tokens(cache: KVCacheManager, layer: int, k: DeviceArray, v: DeviceArray | None, token_addresses: DeviceArray, stream: StreamLike | None = None, *, count: DeviceArray | None = None, error_count: DeviceArray | None = None) -> None:
    """
    Gathers the tokens at `token_addresses` of layer `layer` into k and v (contiguous CUDA tensors [n, num_kv_heads, head_dim] of float32, float16 or bfloat16; v None for a latent layer), converting from the cache's type (dequantizing a quantized cache's values), in one launch on `stream`. Rows of skipped or bad addresses are left as they were.
    """

class LayerWriteCounters:
    """
    A host copy of one layer's write counters (WriteCounters.read): the largest finite |value| written to K and V, and the values the encoding clipped (docs/layout.md, "Calibration").
    """

    @overload
    def __init__(self) -> None: ...

    @overload
    def __init__(self, k_amax: float, v_amax: float, k_saturated: int = 0, v_saturated: int = 0) -> None: ...

    @property
    def k_amax(self) -> float:
        """Largest finite |value| written to K (0: none)."""

    @k_amax.setter
    def k_amax(self, arg: float, /) -> None: ...

    @property
    def v_amax(self) -> float:
        """Largest finite |value| written to V (0: none)."""

    @v_amax.setter
    def v_amax(self, arg: float, /) -> None: ...

    @property
    def k_saturated(self) -> int:
        """K values the encoding clipped."""

    @k_saturated.setter
    def k_saturated(self, arg: int, /) -> None: ...

    @property
    def v_saturated(self) -> int:
        """V values the encoding clipped."""

    @v_saturated.setter
    def v_saturated(self, arg: int, /) -> None: ...

class WriteCounters:
    """
    Every layer's write counters of one cache, in device memory of their own, zeroed at creation. Pass them to write_tokens / write_tokens_paged (counters=): a write into a quantized cache raises its layer's amax and saturation counts on the device, with no sync; read them on a later step through amax() / saturated() (DLPack views) or read() (a host copy, which waits).
    """

    def __init__(self, cache: KVCacheManager) -> None:
        """Counters for every layer of `cache` (a KVCacheManager)."""

    @property
    def num_layers(self) -> int: ...

    def reset(self, stream: StreamLike | None = None) -> None:
        """
        Zeroes every layer's counters, stream-ordered (default: the cache's stream).
        """

    def amax(self) -> View:
        """View float32 [num_layers, 2] (K, V) of the amax counters, zero-copy."""

    def saturated(self) -> View:
        """
        View int64 [num_layers, 2] (K, V) of the saturation counts (unsigned 64-bit on the device), zero-copy.
        """

    def read(self, stream: StreamLike | None = None) -> list[LayerWriteCounters]:
        """
        A host copy of every layer's counters (list of LayerWriteCounters), after waiting for `stream` (default: the cache's stream).
        """

def calibrated_scales(quantization: KVQuantization, k_amax: float, v_amax: float, has_v: bool = True) -> LayerScales:
    """
    The host-held scales docs/layout.md's calibration gives for observed amax: amax / 448 (FP8_PER_TENSOR), amax / (448 * 6) (NVFP4 global scales). Raises InvalidArgumentError for another quantization, and for an amax that is not finite and > 0, naming it.
    """

HOST_TIER_KERNEL_MAX_BYTES: int = 4194304

HOST_TIER_MAX_SMS: int = 8

HOST_TIER_MAX_CHUNKS: int = 256

class HostTierMethod(enum.Enum):
    """How a host tier transfer moves its bytes."""

    AUTO = 0
    """
    The kernel for at most HOST_TIER_KERNEL_MAX_BYTES (count * host_page_bytes), the copy engine above.
    """

    COPY_ENGINE = 1
    """
    The copy engine: fewer than 16 host pages straight, one descriptor a page half; more staged through the tier's device staging buffer, one descriptor a host page.
    """

    KERNEL = 2
    """
    A kernel on at most HOST_TIER_MAX_SMS multiprocessors over the mapped pinned memory (device lists too).
    """

class PageLayerGeometry:
    """One layer of a page group as its pages hold it."""

    @property
    def kind(self) -> KVLayerKind: ...

    @property
    def num_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    def __eq__(self, arg: object, /) -> bool: ...

    def __repr__(self) -> str: ...

class PageGeometry:
    """
    What a page of one page group is: one page id's bytes of every layer of the group in layer order, each layer's K half then its V half (a latent layer: its one half); then, for FP8_PER_TOKEN_HEAD and NVFP4, every layer's scale pages in the same order. Pages move (host tier, sequence file) only between equal geometries.
    """

    @property
    def data_type(self) -> DataType: ...

    @property
    def quantization(self) -> KVQuantization:
        """How the values are stored and scaled: which scale bytes a page holds."""

    @property
    def tokens_per_page(self) -> int: ...

    @property
    def sliding_window(self) -> int:
        """The group's sliding window, 0 for full attention."""

    @property
    def layers(self) -> list[PageLayerGeometry]:
        """The group's layers, in order (a copy)."""

    @property
    def bytes_per_page(self) -> int:
        """Bytes of one page: the group's bytes_per_page."""

    def __eq__(self, arg: object, /) -> bool: ...

    def __repr__(self) -> str: ...

def page_geometry(layout: KVCacheLayout, group: int) -> PageGeometry:
    """
    Returns the page geometry of page group `group` of `layout` (compute_layout(config) or cache.layout()); raises OutOfRangeError for a group outside the layout's.
    """

class HostTier:
    """
    Pinned host memory for pages of one page group of a cache, in host pages: a host page holds one page id's bytes of every layer of the group in layer order, K then V (a latent layer: its one half), then, for FP8_PER_TOKEN_HEAD and NVFP4, every layer's scale pages in the same order, host_page_bytes() in all. Offload (device pages to host pages) and onboard (host pages to device pages) move every layer of the group, data and scales, in one call, stream-ordered, without a host synchronisation. A host-list transfer touching a host page or page that a host-list transfer on another stream still moves waits for it on the device; device-list transfers are not tracked (order them yourself, and let them complete before the tier goes). The tier keeps its KVCacheManager alive. Calls hold the GIL, so Python threads use a tier one at a time; wait_until_ready releases it. TieredPrefixCache.host_tier(g) lends the tier of a tiered cache, which it keeps alive: its host pages belong to the tiered cache, so offload, allocate_host_pages, release_host_pages and load_sequence refuse it (InvalidArgumentError).
    """

    def __init__(self, cache: KVCacheManager, group: int, num_host_pages: int, *, chunk_bytes: int = 268435456, prefer_gpu_numa_node: bool = True, staging_bytes: int = 134217728, num_host_states: int = 0) -> None:
        """
        Sizes the tier for `num_host_pages` host pages of page group `group` of `cache` (a KVCacheManager, kept alive by the tier), pins the first chunk of `chunk_bytes` and starts a thread pinning the rest (on the GPU's NUMA node with prefer_gpu_numa_node); `staging_bytes` of device memory stage copy-engine transfers, half a direction; `num_host_states` host states (host_state_bytes() each) hold state slots. Raises TypeError when cache is no KVCacheManager, OutOfRangeError for a bad group, InvalidArgumentError for num_host_pages outside [1, 2**31 - 1], chunk_bytes <= 0, staging_bytes < 0, or num_host_states outside [0, 2**31 - 1] or above 0 for a cache without state layers, OutOfMemoryError when memory cannot be had.
        """

    def num_pinned_host_pages(self) -> int:
        """
        Host pages pinned now: host pages [0, num_pinned_host_pages()) are usable. Grows to num_host_pages().
        """

    def num_host_pages(self) -> int:
        """Host pages the tier was sized for."""

    def wait_until_ready(self) -> None:
        """
        Blocks (without the GIL) until every host page is pinned; raises what stopped pinning (the tier keeps the host pages pinned so far).
        """

    def host_page_bytes(self) -> int:
        """Bytes of one host page: the group's bytes_per_page."""

    def num_staging_host_pages(self) -> int:
        """Host pages the copy-engine path stages at a time in each direction."""

    def group(self) -> int:
        """The page group the tier holds pages of."""

    def device(self) -> int:
        """The device the tier's memory is mapped for."""

    def numa_node(self) -> int:
        """The NUMA node the memory was bound to, or -1 when it was not."""

    def geometry(self) -> PageGeometry:
        """The geometry a host page's bytes have (what sequence files record)."""

    def host_page_view(self, host_page: int) -> View:
        """
        Host view (uint8 [host_page_bytes()], DLPack kDLCPU: numpy.from_dlpack, torch.from_dlpack) of host page `host_page`, after waiting on the host for the tier's transfers touching it; later transfers into it change what it shows. The view keeps the tier alive. Raises OutOfRangeError outside [0, num_pinned_host_pages()).
        """

    def allocate_host_pages(self, count: int) -> list[int]:
        """
        Hands out `count` free host pages among those pinned (released ones first, most recent first; then never used ones in ascending order), all or nothing: OutOfMemoryError naming the count, the free host pages and the pinned ones when they do not fit.
        """

    def release_host_pages(self, host_pages: HostIds) -> None:
        """
        Returns host pages (a sequence of ints or a 1-D int array) to the free list, all or nothing: OutOfRangeError outside [0, num_pinned_host_pages()), InvalidArgumentError for one not handed out or listed twice.
        """

    def num_free_host_pages(self) -> int:
        """Host pages neither handed out nor waiting to be pinned."""

    def offload(self, entries: HostTierEntries, stream: StreamLike | None = None, *, method: HostTierMethod = HostTierMethod.AUTO, count: DeviceArray | None = None, error_count: DeviceArray | None = None) -> HostTierMethod:
        """
        Copies each entry's device page, every layer of the group, K and V, to its host page.
        entries: (page, host_page) pairs, page a page id of the tier's group in its cache, host_page one of the tier's.
        A host list (sequence of pairs, [n, 2] int array) is checked before anything is enqueued and moves by `method`
        (AUTO: the kernel up to HOST_TIER_KERNEL_MAX_BYTES, the copy engine above); returns the method used. A device
        int32 array ([n, 2] or [2n], __dlpack__ or __cuda_array_interface__) moves with the kernel, which reads it
        when it runs, so a CUDA graph that captured the call replays with its current contents: entries holding
        UNUSED_PAGE_ENTRY are skipped, bad ones are skipped and counted in error_count; count / error_count are optional
        one-element device int32 arrays (device lists only); returns HostTierMethod.KERNEL. Stream-ordered on `stream`
        (default: the cache's), without a host synchronisation. Host lists raise, before enqueuing anything:
        OutOfRangeError for a page outside [0, the group's num_pages) or a host page outside
        [0, num_pinned_host_pages()), InvalidArgumentError for a page or a host page listed twice or a capturing stream
        (capture the device-list form).
        """

    def onboard(self, entries: HostTierEntries, stream: StreamLike | None = None, *, method: HostTierMethod = HostTierMethod.AUTO, count: DeviceArray | None = None, error_count: DeviceArray | None = None) -> HostTierMethod:
        """
        Copies each entry's host page to its device page, every layer of the group, K and V.
        entries: (page, host_page) pairs, page a page id of the tier's group in its cache, host_page one of the tier's.
        A host list (sequence of pairs, [n, 2] int array) is checked before anything is enqueued and moves by `method`
        (AUTO: the kernel up to HOST_TIER_KERNEL_MAX_BYTES, the copy engine above); returns the method used. A device
        int32 array ([n, 2] or [2n], __dlpack__ or __cuda_array_interface__) moves with the kernel, which reads it
        when it runs, so a CUDA graph that captured the call replays with its current contents: entries holding
        UNUSED_PAGE_ENTRY are skipped, bad ones are skipped and counted in error_count; count / error_count are optional
        one-element device int32 arrays (device lists only); returns HostTierMethod.KERNEL. Stream-ordered on `stream`
        (default: the cache's), without a host synchronisation. Host lists raise, before enqueuing anything:
        OutOfRangeError for a page outside [0, the group's num_pages) or a host page outside
        [0, num_pinned_host_pages()), InvalidArgumentError for a page or a host page listed twice or a capturing stream
        (capture the device-list form).
        """

    def is_host_page_busy(self, host_page: int) -> bool:
        """
        True while a host-list transfer touching `host_page` has not completed; OutOfRangeError outside [0, num_host_pages()).
        """

    def synchronize_host_pages(self, host_pages: HostIds) -> None:
        """
        Waits on the host for the tier's transfers touching the listed host pages; raises OutOfRangeError outside [0, num_pinned_host_pages()), CudaError when a transfer failed.
        """

    def last_event(self) -> int:
        """
        The cudaEvent_t handle (an int) recorded after the latest host-list transfer (pages or states), 0 before the first; valid until the next transfer call.
        """

    def num_host_states(self) -> int:
        """
        Host states the tier holds (num_host_states at construction), all pinned.
        """

    def host_state_bytes(self) -> int:
        """
        Bytes of one host state: the cache layout's state_bytes_per_slot (0 without state layers).
        """

    def host_state_view(self, host_state: int) -> View:
        """
        Host view (uint8 [host_state_bytes()], DLPack kDLCPU) of host state `host_state`: every state layer's slot in layout order, each layer's tensors in config order, back to back; after waiting on the host for the tier's transfers touching it. The view keeps the tier alive. Raises OutOfRangeError outside [0, num_host_states()).
        """

    def allocate_host_states(self, count: int) -> list[int]:
        """
        Hands out `count` free host states, all or nothing: OutOfMemoryError naming the count and the free host states when they do not fit.
        """

    def release_host_states(self, host_states: HostIds) -> None:
        """
        Returns host states to the free list, all or nothing: OutOfRangeError outside [0, num_host_states()), InvalidArgumentError for one not handed out or listed twice.
        """

    def num_free_host_states(self) -> int:
        """Host states not handed out."""

    def offload_states(self, entries: HostStateEntries, stream: StreamLike | None = None) -> None:
        """
        Copies each entry's state slot, every state layer and tensor, to its host state.
        entries: (slot, host_state) pairs (a sequence of pairs or an [n, 2] int array), slot a state slot of the
        tier's cache, host_state one of the tier's. Every state layer and tensor of the slot moves, stream-ordered on
        `stream` (default: the cache's), without a host synchronisation; a transfer touching a host state or slot that
        one on another stream still moves waits for it on the device. Raises, before enqueuing anything:
        OutOfRangeError for a slot outside [0, num_state_slots) or a host state outside [0, num_host_states()),
        InvalidArgumentError for a cache without state layers, a slot or a host state listed twice or a capturing
        stream.
        """

    def onboard_states(self, entries: HostStateEntries, stream: StreamLike | None = None) -> None:
        """
        Copies each entry's host state to its state slot, every state layer and tensor.
        entries: (slot, host_state) pairs (a sequence of pairs or an [n, 2] int array), slot a state slot of the
        tier's cache, host_state one of the tier's. Every state layer and tensor of the slot moves, stream-ordered on
        `stream` (default: the cache's), without a host synchronisation; a transfer touching a host state or slot that
        one on another stream still moves waits for it on the device. Raises, before enqueuing anything:
        OutOfRangeError for a slot outside [0, num_state_slots) or a host state outside [0, num_host_states()),
        InvalidArgumentError for a cache without state layers, a slot or a host state listed twice or a capturing
        stream.
        """

    def is_host_state_busy(self, host_state: int) -> bool:
        """
        True while a transfer touching `host_state` has not completed; OutOfRangeError outside [0, num_host_states()).
        """

    def synchronize_host_states(self, host_states: HostIds) -> None:
        """
        Waits on the host for the tier's transfers touching the listed host states; raises OutOfRangeError outside [0, num_host_states()), CudaError when a transfer failed.
        """

SEQUENCE_FILE_VERSION: int = 3

SEQUENCE_FILE_OLDEST_VERSION: int = 2

class SequenceStateTensor:
    """
    One state tensor of a sequence file's state: one state slot of state layer `state_layer`'s tensor `tensor`.
    """

    @property
    def state_layer(self) -> int: ...

    @property
    def tensor(self) -> int: ...

    @property
    def data_type(self) -> DataType: ...

    @property
    def shape(self) -> list[int]:
        """One slot's shape."""

    @property
    def slot_bytes(self) -> int: ...

class SequenceFileInfo:
    """What a sequence file's header says."""

    @property
    def version(self) -> int: ...

    @property
    def geometry(self) -> PageGeometry: ...

    @property
    def page_count(self) -> int: ...

    @property
    def token_count(self) -> int: ...

    @property
    def layer_scales(self) -> list[LayerScales]:
        """
        The host-held scales the pages were written under, a LayerScales a layer of the geometry, for FP8_PER_TENSOR and NVFP4 (a latent layer's v is 0, not compared, and taken back by set_layer_scales); empty for the other quantizations. Set them with KVCacheManager.set_layer_scales before load_sequence into a cache whose scales differ.
        """

    @property
    def state_tensors(self) -> list[SequenceStateTensor]:
        """
        The state tensors of the sequence's state slot the file holds, in packed order (state layers in order, each layer's tensors in config order); empty when it holds no state (every version 2 file).
        """

    @property
    def state_bytes(self) -> int:
        """Bytes of the file's state (0 without one)."""

def save_sequence(path: PathLike, tier: HostTier, host_pages: HostIds, token_count: int, *, host_state: int | None = None) -> None:
    """
    Writes host pages `host_pages` of `tier` (in that order) and `token_count` to a sequence file at `path` (str or os.PathLike), after waiting for the tier's transfers touching them: versioned, checksummed, written atomically (a temporary file renamed over `path`), with the cache's quantization and host-held layer scales. Raises InvalidArgumentError for a token count outside [0, len(host_pages) * tokens_per_page] (full attention), OutOfRangeError for a bad host page, RuntimeError when the file cannot be written (nothing is left behind). With `host_state`, the tier's host state of that index (a sequence's state slot, offload_states) is saved with the pages, recorded with the cache's state tensors; InvalidArgumentError for a cache without state layers, OutOfRangeError for a host state outside [0, tier.num_host_states()).
    """

def load_sequence(path: PathLike, tier: HostTier, host_pages: HostIds, *, host_state: int | None = None) -> int:
    """
    Reads the sequence file at `path` into host pages `host_pages` of `tier` and returns its token count. The whole file is verified before any host page is written: another geometry (quantization included), host-held layer scales other than the cache's, a count other than the file's page count, a format version older than SEQUENCE_FILE_OLDEST_VERSION, a truncated or corrupt file, a host page listed twice raise InvalidArgumentError, a bad host page OutOfRangeError, and every host page keeps its bytes. RuntimeError when the file cannot be read; InvalidArgumentError for a tier lent by a TieredPrefixCache (its host pages are the tiered cache's). With `host_state`, the file's state goes into the tier's host state of that index (onboard_states moves it to a slot), verified with the pages: a file holding no state (version 2 files included) or other state tensors than the cache's raise InvalidArgumentError and leave the host state as it was. Without it, a file's state is verified but not read out.
    """

def read_sequence_file_info(path: PathLike) -> SequenceFileInfo:
    """
    Reads and checks the header of the sequence file at `path` (its page count sizes the host pages to load it into). Raises RuntimeError when it cannot be read, InvalidArgumentError naming the field for a file that is not a sequence file, of a version this build does not read, corrupt or truncated.
    """

def write_sequence_file(path: PathLike, geometry: PageGeometry, token_count: int, pages: HostPageBuffers) -> None:
    """
    Writes `pages` (a sequence of C-contiguous host arrays or bytes-like objects of geometry.bytes_per_page bytes each, e.g. the rows of a uint8 [n, bytes_per_page] array) and `token_count` to a sequence file at `path`, atomically, as save_sequence does for host pages of a tier (without a state).
    """

def read_sequence_file(path: PathLike, expected: PageGeometry, pages: HostPageBuffers) -> int:
    """
    Reads the sequence file at `path` into `pages` (writable C-contiguous host arrays of expected.bytes_per_page bytes each, as many as the file's pages) and returns its token count; the whole file is verified first, so a bad file (or another geometry than `expected`) raises InvalidArgumentError and writes no page.
    """

class TieredAdmission:
    """
    What TieredPrefixCache.admit found for a prompt: the sequence holds device_tokens + host_tokens tokens, and the runtime appends (step) and computes the other compute_tokens.
    """

    def __init__(self) -> None:
        """All zero."""

    @property
    def device_tokens(self) -> int:
        """
        Tokens adopted from pages cached on the device (PageManager.adopt_prefix).
        """

    @property
    def host_tokens(self) -> int:
        """
        Tokens after those, onboarded from the host tiers into fresh pages registered under the same hashes.
        """

    @property
    def compute_tokens(self) -> int:
        """
        len(tokens) - device_tokens - host_tokens: at least 1 for a prompt of at least one token.
        """

    def __repr__(self) -> str: ...

class TieredPrefixCacheStats:
    """A TieredPrefixCache's counters since construction (or reset_stats())."""

    def __init__(self) -> None:
        """All zero."""

    @property
    def admissions(self) -> int:
        """admit() calls that succeeded."""

    @property
    def query_tokens(self) -> int:
        """Prompt tokens those calls were given."""

    @property
    def device_hit_tokens(self) -> int:
        """Prompt tokens found on the device."""

    @property
    def host_hit_tokens(self) -> int:
        """Prompt tokens found on the host."""

    @property
    def missed_tokens(self) -> int:
        """
        Prompt tokens found nowhere (left to compute); the three add up to query_tokens.
        """

    @property
    def offloaded_pages(self) -> int:
        """Evicted device pages copied to a host page, all groups."""

    @property
    def already_on_host_pages(self) -> int:
        """
        Evicted device pages whose hash a host page held already (nothing copied), all groups.
        """

    @property
    def dropped_pages(self) -> int:
        """Evicted device pages the host tier could not take, dropped."""

    @property
    def evicted_host_pages(self) -> int:
        """
        Host pages given up, least recently used first, to make room for an offload, all groups.
        """

    @property
    def onboarded_pages(self) -> int:
        """
        Host pages copied into fresh device pages by admissions, all groups (a run's pages the device had are held, not copied).
        """

    @property
    def spilled_pages(self) -> int:
        """
        Disk tier: host pages written to disk pages when a host tier gave them up, all groups.
        """

    @property
    def already_on_disk_pages(self) -> int:
        """
        Disk tier: host pages given up whose hash a disk page held already (nothing written).
        """

    @property
    def evicted_disk_pages(self) -> int:
        """
        Disk tier: disk pages given up, least recently used first, to make room.
        """

    @property
    def restored_pages(self) -> int:
        """Disk tier: disk pages read back into host pages by admissions."""

    @property
    def disk_failures(self) -> int:
        """
        Disk tier: disk pages that could not be written or read back (then not on the tier; nothing fails).
        """

    @property
    def disk_hit_tokens(self) -> int:
        """
        Disk tier: of host_hit_tokens, tokens whose page some group read back from the disk for the admission.
        """

    @property
    def offloaded_states(self) -> int:
        """
        State checkpoints (num_host_states): checkpoints of evicted carrier pages copied to a host state.
        """

    @property
    def dropped_states(self) -> int:
        """
        State checkpoints: checkpoints of evicted carrier pages dropped, no host state being free (or their save being handed out by the very step that evicted the page).
        """

    @property
    def released_states(self) -> int:
        """
        State checkpoints: host states released because their carrier page's host page was given up.
        """

    @property
    def onboarded_states(self) -> int:
        """
        State checkpoints: host states copied back into a checkpoint slot by admissions.
        """

    @property
    def spilled_states(self) -> int:
        """
        State checkpoints, disk tier: host states written to disk with their carrier page.
        """

    @property
    def restored_states(self) -> int:
        """
        State checkpoints, disk tier: states read back from disk into a host state with their carrier page.
        """

    def __repr__(self) -> str: ...

class TieredPrefixCache:
    """
    A two-tier prefix cache: a PageManager's cached device pages, and pinned host memory (one HostTier per page group) that keeps the pages the device evicts. It makes the two calls of a serving loop that touch pages: admit() (adopts the device's cached prefix, then the longest run of following whole pages, at most len(tokens) - 1 tokens, whose every needed page (all of them in full attention, the window at the run's end in a windowed group) the device or a group's host tier holds: the device's pages are held, the others onboarded into fresh pages) and step() (PageManager.step, then on the stream the offload of the pages it evicted, then its copies). Enqueue the step's kernels on the same stream after the call. It owns the manager's eviction callback while it lives (the PageManager object refuses set_eviction_callback, step and append then: every step goes through the tiered cache; create, fork, free, pages, can_step, ... stay the manager's). A rejected call raises before anything changes. It keeps its KVCacheManager and PageManager alive; destroying it waits for the tiers' transfers and clears the manager's callback. Calls hold the GIL (nothing they do waits on the GPU).
    """

    def __init__(self, cache: KVCacheManager, pages: PageManager, num_host_pages: Sequence[int] | NDArray[Any], *, chunk_bytes: int = 268435456, prefer_gpu_numa_node: bool = True, staging_bytes: int = 134217728, disk_directory: str | os.PathLike[str] | None = None, num_disk_pages: Sequence[int] | NDArray[Any] | None = None, min_offload_priority: int = 0, num_host_states: int = 0) -> None:
        """
        Wires `pages` (a PageManager sized from cache.layout()) to one HostTier per page group of `cache` (a KVCacheManager): num_host_pages[g] host pages for group g, one entry per group, windowed groups included (a run brought back needs a windowed group's window). chunk_bytes, prefer_gpu_numa_node and staging_bytes are each tier's, as HostTier takes them. With disk_directory (a str or os.PathLike, made when missing) and num_disk_pages (one entry per group), host pages the host tiers give up go to disk pages there (a one-page sequence file each, removed with the tiered cache; one tiered cache a directory) and admissions read them back (see the C++ TieredPrefixCache). Device pages evicted with a retention priority under min_offload_priority (PageManager.set_retention; 0, the default, offloads every page) are not copied to the host. With num_host_states (a cache with state layers whose manager keeps state checkpoints), a checkpoint goes to a host state of the checkpoint group's tier with its carrier page and comes back with a run ending there, into a checkpoint slot whose restore the next step hands out (see the C++ TieredPrefixCache); without, a hybrid model's runs from the host end at checkpoints the device still has. Replaces the manager's eviction callback. Raises TypeError when cache is no KVCacheManager, pages no PageManager or num_host_pages no sequence of ints; InvalidArgumentError when the manager's layout is not the cache's (naming the group and the field), for num_host_pages with another number of entries than the cache has groups or an entry outside [1, 2**31 - 1], the same for num_disk_pages, min_offload_priority outside [0, 100], num_host_states outside [0, 2**31 - 1] or above 0 for a manager keeping no checkpoints, when only one of disk_directory and num_disk_pages is given or the directory cannot be made, and when another TieredPrefixCache serves `pages`; what HostTier raises (OutOfMemoryError, CudaError). The manager is left as it was then.
        """

    def admit(self, sequence: int, tokens: HostIds, stream: StreamLike | None = None, extra_keys: Sequence[tuple[int, int, int]] | None = None) -> TieredAdmission:
        """
        Admits the prompt `tokens` (a sequence of ints or a 1-D int array) into the empty sequence `sequence`: adopts the device's cached prefix, then the run of following whole pages the device, the host tiers and the disk tier hold between them (disk pages read back on the host first), onboarding what it takes, enqueuing the transfers on `stream` (default: the cache's). Returns a TieredAdmission; the sequence then holds len(tokens) - compute_tokens tokens, and the runtime appends the rest with step(). extra_keys as PageManager.adopt_prefix takes them ((position, lo, hi), positions ascending in [0, len(tokens))). Raises, before changing anything, InvalidArgumentError for an unknown or non-empty sequence, a prompt longer than max_sequence_length, extra keys out of order or range, or a stream capturing a graph; CudaError from a transfer.
        """

    def step(self, appends: Sequence[tuple[int, HostIds] | tuple[int, HostIds, Sequence[tuple[int, int, int]]]], stream: StreamLike | None = None) -> list[list[tuple[int, int]]]:
        """
        PageManager.step(appends) (a list of (sequence, tokens[, extra_keys])), then on `stream` (default: the cache's) the offload of the pages it evicted, then its copies. Returns the copies, already enqueued, as PageManager.step does (one list of (src, dst) per group). Enqueue the step's kernels on `stream` after the call. Raises, before changing anything, what PageManager.step raises (InvalidArgumentError, OutOfMemoryError naming the group) and InvalidArgumentError for a capturing stream; CudaError from a transfer or copy.
        """

    def evict_cached(self, group: int, count: int, stream: StreamLike | None = None) -> int:
        """
        PageManager.evict_cached(group, count), then the offload of the pages it evicted on `stream` (default: the cache's); returns how many it evicted. Raises OutOfRangeError for a bad group, InvalidArgumentError for a negative count or a capturing stream, before changing anything.
        """

    def stats(self) -> TieredPrefixCacheStats:
        """The counters (a TieredPrefixCacheStats)."""

    def reset_stats(self) -> None:
        """Sets every counter to 0."""

    def take_events(self) -> list:
        """
        PageManager.take_events(), then the host (medium 'CPU') and disk ('DISK') tiers' events: each hash a host or disk page starts holding is a BlockStored without parent or token ids, each one given up a BlockRemoved. Events are recorded when the PageManager was made with record_events=True.
        """

    def counters(self) -> dict:
        """
        PageManager.counters() with the host and disk tiers: prefix_hit_tokens and evicted_pages by tier (device, host, disk; disjoint), offloaded_pages, onboarded_pages, spilled_pages, restored_pages, disk_failures, and each tenant's host and disk hits.
        """

    def prometheus_text(self, prefix: str = 'kvcache') -> str:
        """
        counters() in Prometheus' text exposition format, every metric named <prefix>_..._total.
        """

    def num_groups(self) -> int:
        """The number of page groups (one host tier each)."""

    def host_tier(self, group: int) -> HostTier:
        """
        The HostTier of page group `group`, lent: it keeps this tiered cache alive, and its host pages are the tiered cache's, so read them (host_page_view, onboard, save_sequence with find_host_page's host pages) but do not write, hand out or release them (offload, allocate_host_pages, release_host_pages and load_sequence refuse it). Raises OutOfRangeError for a group outside [0, num_groups()).
        """

    def num_host_pages_held(self, group: int) -> int:
        """
        The host pages of `group` holding a page now. Raises OutOfRangeError for a bad group.
        """

    def find_host_page(self, group: int, hash: tuple[int, int]) -> int:
        """
        The host page of `group` holding the page of `hash` (a (lo, hi) tuple, as PageManager.hash_next_pages and the eviction callback give it), or -1. Raises OutOfRangeError for a bad group, TypeError for a hash that is no such tuple.
        """

    def num_disk_pages_held(self, group: int) -> int:
        """
        The disk pages of `group` holding a page now (0 without a disk tier). Raises OutOfRangeError for a bad group.
        """

    def find_disk_page(self, group: int, hash: tuple[int, int]) -> int:
        """
        The disk page of `group` holding the page of `hash` (its file: disk_directory/group<g>-page<d>.kvseq), or -1 (also without a disk tier). Raises as find_host_page.
        """

    def num_host_states_held(self) -> int:
        """The host states holding a state checkpoint now (num_host_states)."""

    def find_host_state(self, hash: tuple[int, int]) -> int:
        """
        The host state (of host_tier(checkpoint_group())) holding the checkpoint keyed by `hash` (the hash of its prefix's last page, a (lo, hi) tuple), or -1. Raises TypeError for a hash that is no such tuple.
        """

    def checkpoint_group(self) -> int:
        """
        The page group whose pages carry state checkpoints and whose tier holds the host states, or -1 when the manager keeps none.
        """

    def check_invariants(self) -> None:
        """
        Raises RuntimeError naming the first broken rule of the bookkeeping (each group's hash -> host page map and its least recently used order; no host page left pinned between calls); linear time.
        """

def layout_transfer_description(layout: KVCacheLayout, pool_bases: Sequence[int], device: int = 0, host_scales: Sequence[LayerScales] = [], model_config: Config | None = None, tp: int = 1, rank: int = 0) -> bytes:
    """
    The transfer description of memory laid out as `layout`'s cache whose pools start at `pool_bases` (per group, per part of its page: each layer's data, then each layer's page scales; then per state layer the start of its allocation: the order of transfer_registration's rows), on `device`, with `host_scales` (one per layer, or none) and, for rank `rank` of `tp` (model_config: the whole model's Config; `layout` is then the rank's), the heads it holds: what KVCacheManager.transfer_description gives for a cache, for pools the caller allocated itself (e.g. host memory). Raises InvalidArgumentError for counts that do not match the layout.
    """

def transfer_registration(description: bytes) -> Annotated[NDArray[numpy.int64], dict(shape=(None, 3))]:
    """
    The memory a transfer library registers to move the pages of the cache `description` describes (KVCacheManager.transfer_description): one (address, bytes, device) row per pool, an [n, 3] int64 NumPy array.
    """

def transfer_mismatch(local: bytes, remote: bytes, group: int) -> str:
    """
    "" when pages of `group` can move between the caches the two descriptions describe, else the first reason they cannot, naming the field and both values.
    """

def transfer_descriptors(local: bytes, local_pages: PageIds, remotes: Sequence[bytes], remote_pages: PageIds, group: int, num_tokens: int) -> list[tuple[NDArray[Any], NDArray[Any], NDArray[Any]]]:
    """
    Per remote description in `remotes`, the ranges that move tokens [0, num_tokens) of one sequence in page group `group` between the remote pages `remote_pages` and the local pages `local_pages` (each in its own cache's page size, as PageManager.pages gives them; -1 for pages a window released): a tuple (local, remote, layer_ends) of two [n, 3] int64 arrays of (address, bytes, device) rows, row i of one moving to row i of the other, and per layer of the group the end of its rows. Page sizes may differ by a whole factor and heads by tensor-parallel slices (docs/transfer_descriptors.md). Raises InvalidArgumentError naming the first mismatch or bad argument, OutOfRangeError for a page id outside the pool.
    """

def transfer_prepared_descriptors(description: bytes, group: int, tokens_per_descriptor: int) -> tuple[NDArray[Any], NDArray[Any], int, int]:
    """
    The prepared descriptor list of page group `group` of the cache `description` describes, `tokens_per_descriptor` tokens a descriptor: a tuple (blocks, layer_ends, num_pages, descriptors_per_page). blocks is an [n, 5] int64 array of (address, bytes, device, stride, count) rows, the strided form NIXL's prep_xfer_dlist takes: per layer, per part (data, then page scales), per half (K, then V), num_pages * descriptors_per_page descriptors, descriptor page * descriptors_per_page + s holding the s-th run of tokens_per_descriptor tokens of page `page`. layer_ends gives, per layer, the end of its rows. Raises OutOfRangeError for a group outside the description, InvalidArgumentError for a tokens_per_descriptor that does not divide the group's tokens per page.
    """

def transfer_prepared_plan(local: bytes, remotes: Sequence[bytes], group: int) -> tuple[int, list[int]]:
    """
    How page group `group` moves between the local cache and the remote ones through prepared descriptor lists: a tuple (tokens_per_descriptor, layer_sources). tokens_per_descriptor is the smaller page size, which both sides' transfer_prepared_descriptors use; layer_sources gives, per layer, the index in `remotes` of the cache it comes from whole, or -1 where its heads come in tensor-parallel slices (then only transfer_descriptors' ranges express it). Raises InvalidArgumentError as transfer_descriptors does.
    """

def transfer_state_mismatch(local: bytes, remote: bytes) -> str:
    """
    "" when state slots can move between the caches the two descriptions describe, else the first reason they cannot, naming the field and both values: another tensor-parallel size or rank, another number of state layers or tensors, or a tensor of another data type or shape.
    """

def transfer_state_descriptors(local: bytes, local_slots: PageIds, remote: bytes, remote_slots: PageIds) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
    """
    The ranges that move the states of sequences, every state layer and tensor, between the remote slots `remote_slots[i]` and the local slots `local_slots[i]`: a tuple (local, remote, layer_ends) of two [n, 3] int64 arrays of (address, bytes, device) rows, row i of one moving to row i of the other, and per state layer the end of its rows. Raises InvalidArgumentError naming the mismatch (transfer_state_mismatch) or the bad argument, OutOfRangeError for a slot outside [0, num_state_slots).
    """

def transfer_prepared_state_descriptors(description: bytes) -> tuple[NDArray[Any], NDArray[Any], int]:
    """
    The state slots of the cache `description` describes as a prepared descriptor list: a tuple (blocks, layer_ends, num_state_slots). blocks is an [n, 5] int64 array of (address, bytes, device, stride, count) rows, one per state layer and tensor, each of num_state_slots descriptors: descriptor s of a block is slot s. layer_ends gives, per state layer, the end of its rows. Empty without state layers.
    """

class KVEventPublisher:
    """
    Publishes KV events in vLLM's wire format over ZeroMQ (kvcache::events): three frames a message (topic, 8-byte big-endian sequence number, msgpack batch), an optional ROUTER replay socket, never blocking the caller (docs/kv_events.md). Needs a build with kvcache::events: see available().
    """

    def __init__(self, endpoint: str = 'tcp://*:5557', *, replay_endpoint: str = '', topic: str = '', encoding: str = 'map', data_parallel_rank: int | None = None, replay_batches: int = 10000, queue_bytes: int = 16777216, send_high_water_mark: int = 100000, linger_ms: int = 0) -> None:
        """
        Opens the sockets. endpoint is bound when it holds '*' or '::' or is ipc:// or inproc:// ('tcp://127.0.0.1:*' binds a free port: see endpoint), connected otherwise; replay_endpoint (bound) is empty for no replays; encoding 'map' (vLLM's current form) or 'array' (the older positional form); queue_bytes: the queue between publish and the sending thread (a batch that finds no room is dropped); linger_ms: how long closing lets sent batches reach subscribers.
        """

    @staticmethod
    def available() -> bool:
        """
        Whether this build has kvcache::events; without it, making a KVEventPublisher raises RuntimeError.
        """

    def publish(self, source: object) -> int:
        """
        Takes the events `source` (a PageManager or a TieredPrefixCache, made with record_events=True) recorded since its last take and queues them as one batch; returns its sequence number, or -1 when there were none. Call it once per step, after the step.
        """

    def flush(self, timeout_ms: int) -> bool:
        """
        Waits until every batch published so far is sent or dropped; False after timeout_ms.
        """

    def wait_for_subscriber(self, timeout_ms: int) -> bool:
        """Returns True once a subscriber has subscribed, False after timeout_ms."""

    def num_subscribers(self) -> int:
        """
        The subscriptions the PUB socket has seen (subscribes less unsubscribes).
        """

    @property
    def endpoint(self) -> str:
        """The PUB endpoint as bound or connected (a bound '*' port resolved)."""

    @property
    def replay_endpoint(self) -> str:
        """The replay endpoint as bound; empty without one."""

    def stats(self) -> dict:
        """
        Counters since construction as a dict: batches, events, dropped_batches, replays, bad_replay_requests.
        """

__version__: str

def gpu_unavailable_reason() -> str:
    """Returns why no GPU can be used here, or an empty string when one can."""

__all__: list = ['InvalidArgumentError', 'InvalidConfigError', 'OutOfRangeError', 'OutOfMemoryError', 'CudaError', 'DataType', 'data_type_size', 'data_type_name', 'KVLayerKind', 'KVQuantization', 'NVFP4_BLOCK_VALUES', 'TOKENS_PER_PAGE', 'MAX_TOKENS_PER_PAGE', 'MAX_NUM_PAGES', 'UNUSED_PAGE_ENTRY', 'MAX_INLINE_PAGE_OPS', 'MAX_INLINE_STATE_COPIES', 'KVLayerConfig', 'LayerScales', 'MAX_STATE_DIMS', 'STATE_TENSOR_ALIGNMENT', 'StateSplitSegment', 'StateTensorConfig', 'StateLayerConfig', 'Config', 'KVLayerLayout', 'KVPageGroupLayout', 'StateTensorLayout', 'StateLayerLayout', 'KVCacheLayout', 'BudgetSplit', 'compute_layout', 'max_pages_for_budget', 'split_budget', 'View', 'KVHalf', 'PageOpTarget', 'LayerRef', 'KVCacheManager', 'PageAllocator', 'PageTableBuffers', 'PageHashAlgorithm', 'PageGroupCounts', 'PageManagerStats', 'PageManager', 'StepArguments', 'write_tokens', 'write_tokens_paged', 'read_tokens', 'LayerWriteCounters', 'WriteCounters', 'calibrated_scales', 'HOST_TIER_KERNEL_MAX_BYTES', 'HOST_TIER_MAX_SMS', 'HOST_TIER_MAX_CHUNKS', 'HostTierMethod', 'PageLayerGeometry', 'PageGeometry', 'page_geometry', 'HostTier', 'SEQUENCE_FILE_VERSION', 'SEQUENCE_FILE_OLDEST_VERSION', 'SequenceStateTensor', 'SequenceFileInfo', 'save_sequence', 'load_sequence', 'read_sequence_file_info', 'write_sequence_file', 'read_sequence_file', 'TieredAdmission', 'TieredPrefixCacheStats', 'TieredPrefixCache', 'layout_transfer_description', 'transfer_registration', 'transfer_mismatch', 'transfer_descriptors', 'transfer_prepared_descriptors', 'transfer_prepared_plan', 'transfer_state_mismatch', 'transfer_state_descriptors', 'transfer_prepared_state_descriptors', 'KVEventPublisher', '__version__', 'gpu_unavailable_reason']
