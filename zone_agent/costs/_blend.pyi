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

class Kernel:
    """``blend_choice`` holding its input arrays' buffers between calls."""

    def blend_choice(self, *args: Any) -> int: ...
    def kv_floor(self, kv_blocks: Any, slots: Any, kv_free_base: Any, /) -> float: ...
