"""The machine models and their one setting."""
import os

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.machine import MACHINES, resolve_machine


@pytest.fixture(autouse=True)
def no_setting(monkeypatch):
    monkeypatch.delenv("TORCHNEURON_MACHINE", raising=False)
    monkeypatch.delenv("TORCHNEURON_NKI_TARGET", raising=False)
    yield
    nki.set_machine(None)


def test_published_figures_of_the_two_models():
    trn2, trn3 = MACHINES["trn2"], MACHINES["trn3"]
    assert (trn2.device, trn2.name, trn3.device, trn3.name) == ("Trainium2", "NeuronCore-v3", "Trainium3", "NeuronCore-v4")
    assert trn2.sbuf_bytes == 28 << 20 and trn3.sbuf_bytes == 32 << 20
    assert trn2.psum_bytes_per_partition * 128 == trn3.psum_bytes_per_partition * 128 == 2 << 20
    assert trn2.cores_per_device == trn3.cores_per_device == 8
    assert trn2.hbm_bytes_per_core == 12 << 30 and trn3.hbm_bytes_per_core == 18 << 30
    assert trn2.device_name == "NeuronCore-v3 (emulated)" and trn3.device_name == "NeuronCore-v4 (emulated)"
    assert trn3.mx_matmul and not trn2.mx_matmul
    assert trn2.dma_bytes_per_ns == pytest.approx(368) and trn3.dma_bytes_per_ns == pytest.approx(528)


@pytest.mark.parametrize("name,key", [("trn2", "trn2"), ("Trainium3", "trn3"), ("v4", "trn3"), ("gen3", "trn2"),
                                      ("NeuronCore-v3", "trn2"), ("inf2", "trn1")])
def test_names(name, key):
    assert resolve_machine(name).key == key


def test_unknown_name_is_an_error(monkeypatch):
    with pytest.raises(ValueError, match="unknown machine"):
        nki.set_machine("trn9")
    monkeypatch.setenv("TORCHNEURON_MACHINE", "gpu")
    with pytest.raises(ValueError, match="TORCHNEURON_MACHINE"):
        nki.get_machine()


@nki.jit
def machine_facts(x):
    out = nl.ndarray((1, 3), dtype=nl.int32, buffer=nl.shared_hbm)
    vals = nl.ndarray((1, 3), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(vals[:, 0:1], nisa.get_nc_version().value)
    nisa.memset(vals[:, 1:2], nl.tile_size.sbuf_fmax_bytes // 1024)
    nisa.memset(vals[:, 2:3], nl.tile_size.sbuf_size_bytes // (1 << 20))
    nl.store(out, value=vals)
    return out


def test_the_kernel_sees_the_machine(monkeypatch):
    x = np.zeros((1, 1), np.float32)
    assert machine_facts(x).tolist() == [[3, 224, 28]]            # default: Trainium2
    monkeypatch.setenv("TORCHNEURON_MACHINE", "trn3")
    assert machine_facts(x).tolist() == [[4, 256, 32]]
    nki.set_machine("trn2")                                       # the call wins over the variable
    assert os.environ["TORCHNEURON_MACHINE"] == "trn2"
    assert machine_facts(x).tolist() == [[3, 224, 28]]
    assert nki.jit(machine_facts.fn, target="trn3")(x).tolist() == [[4, 256, 32]]


def test_a_psum_bank_holds_1024_two_byte_elements_on_neuroncore_v4():
    import torchneuron.nki as nki
    import torchneuron.nki.language as nl

    def kernel(x):
        acc = nl.ndarray((128, 1024), dtype=nl.bfloat16, buffer=nl.psum)
        return x

    x = np.zeros((1, 1), np.float32)
    nki.jit(kernel, target="trn3")(x)
    with pytest.raises(nki.NKILimitError, match="maximum is 512"):
        nki.jit(kernel, target="trn2")(x)
