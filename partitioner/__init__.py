"""partitioner: from a lowered `Graph` to a per-tile BSP program (built in later issues).

Its role in the pipeline, after `lowering` and before `ipujax`: propagate shardings over a mesh of
IPUs, insert collectives over IPU axes, map every tensor onto tiles, split the program into
phases, and schedule BSP supersteps (exchange -> sync -> compute). It may import `lowering`,
never `ipujax`.
"""
