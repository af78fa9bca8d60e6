"""Two operations on a transformers ``DynamicCache`` that the samplers need."""


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
