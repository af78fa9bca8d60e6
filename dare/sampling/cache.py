"""The operations on a transformers ``DynamicCache`` that the samplers need."""


def truncate(cache, length: int) -> None:
    """Keep the first ``length`` cached positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def move_tail(cache, start: int, end: int) -> None:
    """Dual cache: the last ``end - start`` cached positions were just computed for positions ``start:end``;
    write them there (in place) and drop the tail."""
    n = end - start
    for layer in cache.layers:
        layer.keys[..., start:end, :] = layer.keys[..., -n:, :]
        layer.values[..., start:end, :] = layer.values[..., -n:, :]
    cache.crop(-n)


def keep_rows(cache, rows) -> None:
    """Keep (or repeat) the batch rows ``rows`` of every layer; unlike ``batch_select_indices``, also of a layer
    cropped to no positions, which keeps its batch size for the next ``update``."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys.dim() == 4:
            layer.keys, layer.values = layer.keys[rows], layer.values[rows]
