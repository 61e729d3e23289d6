"""The only module that touches transformers' KV-cache API (it changes between versions).

transformers 5.x ``DynamicCache.crop`` takes a *negative count of tokens to remove*; 4.x took the
new length. Everything else in the package calls :func:`crop_to` with the length to keep.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache(model=None) -> DynamicCache:
    """An empty cache for ``model`` (the config lets transformers pick sliding-window layers)."""
    config = getattr(model, "config", None)
    try:
        return DynamicCache(config=config) if config is not None else DynamicCache()
    except TypeError:  # older transformers without the config argument
        return DynamicCache()


def cache_len(cache) -> int:
    """Number of positions currently held (0 for None)."""
    return 0 if cache is None else int(cache.get_seq_length())


def crop_to(cache, length: int) -> None:
    """Keep the first ``length`` positions of every layer (the rollback after verification)."""
    current = cache_len(cache)
    if length < 0 or length > current:
        raise ValueError(f"cannot crop a cache of {current} positions to {length}")
    if length == current:
        return
    try:
        cache.crop(length - current)  # transformers >= 5: negative count to remove
    except ValueError:
        cache.crop(length)  # transformers 4.x: the new absolute length


def _layers_kv(cache):
    if hasattr(cache, "layers"):
        return [(layer, "keys", "values") for layer in cache.layers]
    raise NotImplementedError("this transformers version's cache layout is not supported by kv.py")


def _index_select(cache, index: torch.Tensor, dim: int) -> None:
    """Keep ``index`` along ``dim`` of every layer's keys and values (dim -2: positions, 0: rows)."""
    index = index.to(torch.long)
    for layer, k_name, v_name in _layers_kv(cache):
        keys = getattr(layer, k_name, None)
        if keys is None or keys.numel() == 0:
            continue
        idx = index.to(keys.device)
        setattr(layer, k_name, keys.index_select(dim, idx))
        setattr(layer, v_name, getattr(layer, v_name).index_select(dim, idx))


def keep_positions(cache, positions: torch.Tensor) -> None:
    """Keep only the given sequence positions (sorted, 1-D), in that order, in every layer.

    Used after tree verification: the cache holds the whole candidate tree and must be compacted
    to the committed prefix plus the accepted path. The kept positions start with the untouched
    prefix 0, 1, ..., j - 1; only the few after it move (the accepted path's entries, at most the
    tree's depth), in place, and the rest is cut off. Copying the whole cache instead would cost
    every tree step time in proportion to the context.
    """
    positions = positions.to(torch.long).reshape(-1)
    n = positions.numel()
    same = positions == torch.arange(n, dtype=torch.long, device=positions.device)
    prefix = n if bool(same.all()) else int(same.to(torch.int8).argmin())
    for layer, k_name, v_name in _layers_kv(cache):
        keys = getattr(layer, k_name, None)
        if keys is None or keys.numel() == 0:
            continue
        moved = positions[prefix:].to(keys.device)
        for name in (k_name, v_name):
            t = getattr(layer, name)
            if prefix < n:
                t[..., prefix:n, :] = t.index_select(-2, moved)  # the source is copied out before the write
            setattr(layer, name, t[..., :n, :])


def layer_len(cache, layer_idx: int) -> int:
    """Positions held by one layer (layers can differ while a self-speculative draft is in flight)."""
    return int(cache.layers[layer_idx].get_seq_length()) if layer_idx < len(cache.layers) else 0


def crop_layers_to(cache, length: int, layer_indices) -> None:
    """Keep the first ``length`` positions of the given layers only.

    transformers 5.x ``Cache.crop`` removes the same *count* from every layer, which is wrong once
    layers hold different lengths (an early-exit draft writes only its first L layers).
    """
    for i in layer_indices:
        current = layer_len(cache, i)
        if length < 0 or length > current:
            raise ValueError(f"cannot crop layer {i} of {current} positions to {length}")
        if length < current:
            cache.layers[i].crop(length - current)


# --- batched caches (batch.py): rows of different lengths share one padded cache --------------

def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep only the batch rows ``rows`` (1-D LongTensor of row indices, in the new order) in
    every layer: the requests that finished leave the batch."""
    _index_select(cache, rows, dim=0)


def gather_slots(cache, index: torch.Tensor) -> None:
    """Row b keeps the slots ``index[b]`` (LongTensor [B, S']) in that order, in every layer.

    Compaction of a ragged batch: each row's committed keys move to the front of its row, so the
    holes left by rejected drafts and by rows of different lengths stop costing attention time.
    """
    index = index.to(torch.long)
    for layer, k_name, v_name in _layers_kv(cache):
        keys = getattr(layer, k_name, None)
        if keys is None or keys.numel() == 0:
            continue
        b, h, _, d = keys.shape
        idx = index.to(keys.device)[:, None, :, None].expand(b, h, index.shape[1], d)
        setattr(layer, k_name, keys.gather(2, idx))
        setattr(layer, v_name, getattr(layer, v_name).gather(2, idx))


def concat_rows(cache, other) -> None:
    """Append the rows of ``other`` after the rows of ``cache``, in every layer (in place).

    Continuous batching: requests prefilled on their own join the running batch. The cache with
    fewer slots is left-padded with zero keys and values first; the caller marks those slots
    empty (``ragged_cache.EMPTY_SLOT`` in RaggedCache.join), so no query ever attends to them.
    """
    mine, theirs = _layers_kv(cache), _layers_kv(other)
    if len(mine) != len(theirs):
        raise ValueError(f"cannot join caches of {len(mine)} and {len(theirs)} layers")
    for (layer, k_name, v_name), (olayer, _, _) in zip(mine, theirs):
        parts = []
        for src in (layer, olayer):
            keys = getattr(src, k_name, None)
            parts.append((keys, getattr(src, v_name, None)))
        if parts[1][0] is None or parts[1][0].numel() == 0:
            continue
        if parts[0][0] is None or parts[0][0].numel() == 0:
            raise ValueError("cannot join rows to a cache that holds no keys yet; use the other cache instead")
        width = max(parts[0][0].shape[-2], parts[1][0].shape[-2])
        padded = []
        for keys, values in parts:
            pad = width - keys.shape[-2]
            if pad:
                keys = torch.nn.functional.pad(keys, (0, 0, pad, 0))
                values = torch.nn.functional.pad(values, (0, 0, pad, 0))
            padded.append((keys, values))
        setattr(layer, k_name, torch.cat([padded[0][0], padded[1][0]], dim=0))
        setattr(layer, v_name, torch.cat([padded[0][1], padded[1][1]], dim=0))
