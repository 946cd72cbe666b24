from collections.abc import Mapping
from typing import Any

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

class Kernel:
    """``ttft_costs`` holding its input arrays' buffers between calls."""

    def ttft_costs(self, *args: Any) -> None: ...
