"""torchrun on `neuron`: tests/distributed_ddp_script.py (init_process_group()
with no backend, then DDP) launched on one node with two processes, and on
two nodes made of network namespaces joined by a veth pair (each rank with
its own address and GLOO_SOCKET_IFNAME, c10d rendezvous); both train as one
process on the global batch, as does a run whose rank 1 is killed mid-way
and restarted by torchrun (--max-restarts) from the checkpoint. The namespaces are made and removed by the
test, which is skipped, saying why, where they cannot be made."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import distributed_ddp_script as script
from distributed_testing import free_port
from neuron_testing import ROOT

SCRIPT = os.path.join(ROOT, "tests", "distributed_ddp_script.py")
LAUNCH_TIMEOUT = 60


def _env(**extra):
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _launch(command, **env):
    """A launcher in its own process group, so that a timeout ends its workers too."""
    return subprocess.Popen(command, cwd=ROOT, env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _finish(procs):
    """Waits for every launcher; ends them all, with their workers, if one
    fails or outlasts the timeout, and fails with their output."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.returncode not in (None, 0) for p in procs):
            break
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    outputs = [p.communicate()[0] for p in procs]
    report = "\n".join(f"--- launcher {i} (exit {p.returncode}):\n{out[-3000:]}"
                       for i, (p, out) in enumerate(zip(procs, outputs)))
    assert all(p.returncode == 0 for p in procs), report
    return outputs


def _results(out_dir, world):
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def _assert_trains_as_one_process(seen, world):
    losses, params = script.train()
    for r, s in enumerate(seen):
        assert (s["rank"], s["world"]) == (r, world)
        assert s["backend config"] == "neuron:neuron"      # the accelerator's backend, with no backend named
        assert s["default backend type"] == "custom"       # the neuron backend's type, not gloo's (patch c10d-default-backend)
        assert s["losses"] == pytest.approx(losses, rel=1e-6)
        for a, b in zip(s["params"], params):
            torch.testing.assert_close(a, b.cpu(), rtol=1e-6, atol=1e-7)
    for r in range(1, world):
        assert seen[r]["losses"] == seen[0]["losses"]


def test_torchrun_two_processes_on_one_node(tmp_path):
    proc = _launch(_torchrun("--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                             SCRIPT, str(tmp_path)))
    _finish([proc])
    seen = _results(tmp_path, 2)
    _assert_trains_as_one_process(seen, 2)
    assert sorted(s["local_rank"] for s in seen) == [0, 1]
    assert {p["node"] for p in seen[0]["peers"]} == {0}


def test_an_elastic_restart_after_a_killed_rank_resumes_from_the_checkpoint(tmp_path):
    # rank 1 kills itself at step 2 of its first attempt; rank 0 is then in DDP's all_reduce
    proc = _launch(_torchrun("--nproc-per-node=2", "--max-restarts=1", "--rdzv-backend=c10d",
                             f"--rdzv-endpoint=127.0.0.1:{free_port()}", SCRIPT, str(tmp_path), "2"))
    out = _finish([proc])[0]
    seen = _results(tmp_path, 2)
    assert [s["restart"] for s in seen] == [1, 1], out[-3000:]
    _assert_trains_as_one_process(seen, 2)


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_nodes():
    """Two network namespaces joined by a veth pair, each end with its own
    address; [(namespace, interface, address)] for each node. Removed after
    the test (deleting a namespace deletes its end of the pair, and with it
    the other)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("iproute2's ip is not installed (scripts/setup_env.sh installs it)")
    tag = f"tn{os.getpid() % 100000}"
    names, links = [f"{tag}a", f"{tag}b"], [f"{tag}va", f"{tag}vb"]
    subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    made = []
    try:
        for ns in names:
            r = _ip("netns", "add", ns)
            if r.returncode != 0:
                pytest.skip(f"cannot create a network namespace: {r.stderr.strip()}")
            made.append(ns)
        steps = [("link", "add", links[0], "netns", names[0], "type", "veth", "peer", "name", links[1],
                  "netns", names[1])]
        for i, (ns, link) in enumerate(zip(names, links)):
            steps += [("-n", ns, "addr", "add", f"{subnet}.{i + 1}/24", "dev", link),
                      ("-n", ns, "link", "set", link, "up"), ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            r = _ip(*step)
            assert r.returncode == 0, (step, r.stderr)
        yield [(ns, link, f"{subnet}.{i + 1}") for i, (ns, link) in enumerate(zip(names, links))]
    finally:
        for ns in made:
            _ip("netns", "del", ns)


def test_torchrun_two_nodes_in_network_namespaces(tmp_path, two_nodes):
    (_, _, master), _ = two_nodes
    procs = [
        _launch(["ip", "netns", "exec", ns] + _torchrun(
            "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={master}:29400",
            "--rdzv-id=neuron-two-nodes", f"--local-addr={address}",
            # the node whose address is the endpoint hosts the rendezvous store: torchrun's
            # own test compares the endpoint with the addresses of the machine's hostname,
            # which a namespace's address is not among
            f"--rdzv-conf=is_host={'true' if address == master else 'false'}", SCRIPT, str(tmp_path)),
            GLOO_SOCKET_IFNAME=link)
        for ns, link, address in two_nodes]
    _finish(procs)
    seen = _results(tmp_path, 2)
    _assert_trains_as_one_process(seen, 2)
    assert all(s["master"] == master for s in seen)
    peers = seen[0]["peers"]
    assert sorted(p["node"] for p in peers) == [0, 1]
    # one rank on each node, each with its own end of the pair as gloo's interface
    assert sorted(p["ifname"] for p in peers) == sorted(link for _, link, _ in two_nodes)


EXAMPLE = os.path.join(ROOT, "examples", "train_distributed.py")
EXAMPLE_ARGS = dict(steps=3, n_layer=1, n_head=2, d_model=32, block_size=16, batch_size=8, warmup_steps=1)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_example_train_distributed_under_torchrun(tmp_path, mode):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in EXAMPLE_ARGS.items()]
    proc = _launch(_torchrun("--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                             EXAMPLE, f"--mode={mode}", f"--out={tmp_path}", *flags))
    (out,) = _finish([proc])
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    assert (tmp_path / "loss_curve.png").stat().st_size > 0
    assert "max relative loss difference" in out
    assert summary["mode"] == mode and summary["world_size"] == 2
    got = summary["runs"]["distributed"]
    # the demo's own loop in this process, on the global batch
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import gpt_model as gm

    mc = gm.GPTConfig(**{k: EXAMPLE_ARGS[k] for k in ("n_layer", "n_head", "d_model", "block_size")})
    tc = gm.TrainConfig(**{k: EXAMPLE_ARGS[k] for k in ("steps", "batch_size", "warmup_steps")})
    single = gm.train("neuron", seed=1337, model_config=mc, train_config=tc, keep_model=False)
    assert got["losses"] == pytest.approx(single.losses, rel=1e-6)
    assert got["val_loss"] == pytest.approx(single.val_loss, rel=1e-6)
    assert summary["runs"]["single"]["losses"] == pytest.approx(single.losses, rel=1e-6)
