"""An independent model of the cache layout, written from the formulas of docs/layout.md and docs/api.md (not from the
library): what the host tests compare compute_layout against."""

from dataclasses import dataclass, field

ELEMENT_BYTES = {"FLOAT32": 4, "FLOAT16": 2, "BFLOAT16": 2, "FP8_E4M3": 1, "FP8_E5M2": 1, "INT8": 1, "UINT8": 1}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class ModelLayer:
    heads: int
    dim: int
    window: int = 0
    latent: bool = False


@dataclass
class ModelGroup:
    window: int
    pages_per_sequence: int
    layers: list = field(default_factory=list)
    bytes_per_page: int = 0


def pages_per_sequence(seq_len: int, tokens_per_page: int, window: int, step_tokens: int) -> int:
    full = ceil_div(seq_len, tokens_per_page)
    if window == 0:
        return full
    step = step_tokens if step_tokens else seq_len
    return min(full, ceil_div(window - 1 + step, tokens_per_page) + 1)


def model_groups(layers, seq_len, tokens_per_page, step_tokens, element_bytes):
    """Groups by window, full attention first, then ascending windows; bytes of one page id across their layers."""
    windows = sorted({layer.window for layer in layers})
    groups = []
    for window in windows:
        group = ModelGroup(window, pages_per_sequence(seq_len, tokens_per_page, window, step_tokens))
        for index, layer in enumerate(layers):
            if layer.window == window:
                group.layers.append(index)
                halves = 1 if layer.latent else 2
                group.bytes_per_page += halves * tokens_per_page * layer.heads * layer.dim * element_bytes
        groups.append(group)
    return groups
