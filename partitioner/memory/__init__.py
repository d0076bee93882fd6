"""Tile memory: bytes per tile by liveness over a scheduled program, by PopVision's categories.

    liveness       each tensor's storage and the task spans it is on chip for, phase aware
                   (`Storage`, `PhaseBounds`, `storages`, `value_uses`)
    code           code and state per tile: vertex code and state, exchange and control code,
                   stack (PopVision's categories)
    tiles          variables always live and not, per tile by a sweep over the tasks
                   (`TileMemory`, `tile_memory`, `task_excess`, `region_bytes`)
    check          the fullest tiles and their largest tensors; `check_memory` against the budget

May import: `lowering`, the base records (`target`, `errors`, `layout`, `program`) and itself.
"""
