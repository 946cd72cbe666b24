from collections.abc import Mapping
from typing import Any

def blend_choice(
    costs: Any,
    kv_blocks: Any,
    slots: Any,
    kv_own_base: Any,
    kv_free_base: Any,
    inv_total: Any,
    survivors: Any | None,
    inv_scale: float,
    cost_weight: float,
    room_weight: float,
    weight_sum: float,
    /,
) -> int: ...
def ttft_costs(
    out: Any,
    pending: Any,
    streams: Any,
    slots: Any,
    external_queued: Any,
    rate: Any,
    ms_per_token: Any,
    inv_max_batched: Any,
    step_extra_ms: Any,
    matches: Mapping[int, int] | list[tuple[int, bytes]],
    prompt: float,
    per_block: float,
    sequences: float,
    scale: float,
    decode: bool,
    /,
) -> None: ...
