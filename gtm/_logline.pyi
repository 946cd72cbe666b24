from collections.abc import Callable, Sequence

def fields_text(
    prefixes: Sequence[str],
    values: Sequence[object],
    texts: dict[object, str],
    limit: int,
    text_value: Callable[[object], str],
    /,
) -> str: ...
