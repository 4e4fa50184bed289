"""SBUF/PSUM allocation by liveness: a tile's space is free after its last use, and a live set
over the capacity raises an error naming the capacity and the live tiles with sizes and lines."""
import os

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

from neuron_testing import line_of

HERE = os.path.abspath(__file__)
X = np.zeros((128, 8192), np.float32)
CAP_V3 = 229376   # 28 MiB / 128 partitions
CAP_V4 = 262144   # 32 MiB / 128 partitions


@nki.jit
def many_short_lived_tiles(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    keep = []
    acc = nl.zeros(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    for i in range(12):
        t = nl.load(x)                         # 32 KiB per partition, dead after the add below
        keep.append(t)                         # (a Python reference the kernel never uses again)
        acc[...] = nl.add(acc, t)
    nl.store(out, value=acc)
    return out


def test_a_tile_is_free_after_its_last_use():
    # 12 tiles of 32 KiB per partition stay referenced by the list (384 KiB in all), but each is
    # dead after its add: the live set is acc, one tile and the add's result
    x = np.random.default_rng(0).standard_normal((128, 8192)).astype(np.float32)
    np.testing.assert_allclose(many_short_lived_tiles(x), 12 * x, rtol=1e-5)


@nki.jit
def eight_live_tiles(x):
    tiles = []
    for i in range(8):
        tiles.append(nl.load(x))               # MARK-LIVE-LOAD
    total = tiles[0]
    for t in tiles[1:]:                        # every tile is used here, after the last load
        total = nl.add(total, t)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=total)
    return out


def test_live_set_over_capacity_names_capacity_and_live_tiles():
    with pytest.raises(nki.NKILimitError) as e:
        eight_live_tiles(X)
    err = e.value
    msg = str(err)
    line = line_of(HERE, "MARK-LIVE-LOAD")
    # the error points at the allocation that overflowed (the eighth load)
    assert err.location == f"{HERE}:{line} (in eight_live_tiles)"
    assert "SBUF capacity" in msg and "28 MiB" in msg and f"{CAP_V3} bytes per partition" in msg
    assert "262144 bytes per partition" in msg  # 8 x 32 KiB live
    assert msg.count(f"(128, 8192) float32: 32768 B/partition, allocated at {HERE}:{line}") == 8
    assert len(err.live_tiles) == 8 and err.capacity == CAP_V3
    assert all(t["bytes_per_partition"] == 32768 for t in err.live_tiles)


@nki.jit
def reinterpreted_view_stays_live(x):
    a = nl.ndarray((128, 28672), dtype=nl.float32, buffer=nl.sbuf)     # 112 KiB per partition
    nisa.memset(a, 1.0)
    bits = a.view(nl.uint32)                                            # same memory, other dtype
    b = nl.ndarray((128, 28672), dtype=nl.float32, buffer=nl.sbuf)     # a + b: exactly the capacity
    c = nl.ndarray((128, 1024), dtype=nl.uint32, buffer=nl.sbuf)       # MARK-OVER
    nisa.memset(b, 2.0)
    nisa.tensor_copy(dst=c, src=bits[:, 0:1024])                        # a used through its view
    return x


def test_a_view_of_another_dtype_keeps_its_buffer_live():
    with pytest.raises(nki.NKILimitError) as e:
        reinterpreted_view_stays_live(np.zeros((1, 1), np.float32))
    assert e.value.location.startswith(f"{HERE}:{line_of(HERE, 'MARK-OVER')}")
    names = sorted(t["shape"] for t in e.value.live_tiles)
    assert names == [(128, 1024), (128, 28672), (128, 28672)]


@nki.jit
def psum_banks_in_turn(a, b):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    sa, sb = nl.load(a), nl.load(b)
    total = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    for i in range(24):                        # 24 PSUM tiles of a full bank, one live at a time
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, sa, sb)
        total[...] = nl.add(total, acc)
    nl.store(out, value=total)
    return out


def test_psum_banks_are_reused():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((128, 128)).astype(np.float32)
    b = rng.standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_allclose(psum_banks_in_turn(a, b), 24 * (a.T @ b), rtol=1e-4, atol=1e-3)


def sized_for_trainium3(x):
    # 240 KiB per partition live at once: more than NeuronCore-v3's 224 KiB, less than v4's 256 KiB
    big = nl.ndarray((128, 61440), dtype=nl.float32, buffer=nl.sbuf)    # MARK-V4-SIZED
    nisa.memset(big, 3.0)
    out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=big[:, 60416:61440])
    return out


def test_kernel_sized_for_v4_sbuf_fails_on_v3_and_runs_on_v4(monkeypatch):
    x = np.zeros((1, 1), np.float32)
    monkeypatch.delenv("TORCHNEURON_MACHINE", raising=False)
    assert nki.get_machine().key == "trn2"                     # the default: Trainium2
    with pytest.raises(nki.NKILimitError) as e:
        nki.jit(sized_for_trainium3)(x)
    assert f"{CAP_V3} bytes per partition" in str(e.value) and "245760 bytes per partition" in str(e.value)
    assert e.value.location.startswith(f"{HERE}:{line_of(HERE, 'MARK-V4-SIZED')}")
    # the environment variable
    monkeypatch.setenv("TORCHNEURON_MACHINE", "trn3")
    assert np.all(nki.jit(sized_for_trainium3)(x) == 3.0)
    # the Python call (it sets the variable too, for the runtime)
    monkeypatch.setenv("TORCHNEURON_MACHINE", "trn2")
    try:
        assert nki.set_machine("Trainium3").key == "trn3"
        assert os.environ["TORCHNEURON_MACHINE"] == "trn3"
        assert np.all(nki.jit(sized_for_trainium3)(x) == 3.0)
        # a kernel's own target wins
        with pytest.raises(nki.NKILimitError):
            nki.jit(sized_for_trainium3, platform_target="trn2")(x)
    finally:
        nki.set_machine(None)
    assert "TORCHNEURON_MACHINE" not in os.environ
    assert nki.get_machine().key == "trn2"
