"""``nki.isa.constants``: the enumerations of ``nki.isa`` under the module name kernels import them from
(``from nki.isa.constants import oob_mode, dge_mode``).  They are the same objects as ``nki.isa``'s."""
from .isa import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd  # noqa: F401

__all__ = ["dge_mode", "dma_engine", "engine", "matmul_perf_mode", "nc_version", "oob_mode", "reduce_cmd"]
