"""torch.distributed's parallel APIs on `neuron`, differential, two spawned
ranks in one "cpu:gloo,neuron:neuron" group, each rank on its own device:

* FSDP2 (`fully_shard`) trains as one process on the global batch (an MLP
  with SGD, float32, relative 1e-6) and as DDP, and equals FSDP2 on CPU
  tensors over gloo bit for bit: the same MLP, the demo's GPT with its AdamW
  and gradient clipping, mixed precision; CPU offload equals no offload.
* `init_device_mesh("neuron", ...)`: 1-D and 2-D meshes.
* DTensor: distribute_tensor, redistribute and full_tensor against the full
  tensor and against the same calls on a CPU mesh; DTensor's random numbers
  as its offset tracker draws them, reproduced in one process.
* Tensor parallel (ColwiseParallel, RowwiseParallel) against the replicated
  MLP and against tensor parallel on the CPU.
* torch.distributed.checkpoint: sharded model and optimizer state saved on
  `neuron` and on the CPU, loaded across, equal to the CPU's.

"""
import os
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from distributed_testing import attempt, full_state, mlp_batches, rank_share, small_mlp, spawn_ranks, value_of

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import gpt_model as gm  # noqa: E402

WORLD = 2
STEPS = 4
GLOBAL_BATCH = 8


# ------------------------------------------------------------------ programs run on the ranks and in one process

def _mean_over_ranks(loss, parallel):
    loss = loss.detach().clone()
    if parallel:
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    return loss.item()


def _train_mlp(device, mode, rank=0, world=1, offload=False, mp_policy=None):
    """SGD on the MLP: "single" (the global batch), "ddp" or "fsdp" (each
    rank its share; fully_shard on each Linear and on the root)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    device = torch.device(device)
    model = small_mlp().to(device)
    if mode == "fsdp":
        mesh = init_device_mesh(device.type, (world,))
        kw = dict(mesh=mesh, offload_policy=CPUOffloadPolicy() if offload else OffloadPolicy(),
                  mp_policy=mp_policy or MixedPrecisionPolicy())
        fully_shard(model[0], **kw)
        fully_shard(model[2], **kw)
        fully_shard(model, **kw)
    elif mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in mlp_batches(STEPS, GLOBAL_BATCH):
        if mode != "single":
            x, y = rank_share(x, rank, world), rank_share(y, rank, world)
        loss = torch.nn.functional.mse_loss(model(x.to(device)).float(), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(_mean_over_ranks(loss, mode != "single"))
    return losses, full_state(model)


GPT_CONFIG = dict(block_size=16, n_layer=2, n_head=2, d_model=32)


def _train_gpt(device, mode, rank=0, world=1):
    """The demo's GPT with the demo's AdamW (foreach), schedule and gradient
    clipping; "fsdp" shards each block and the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = torch.device(device)
    tok, train_ids, _ = gm.load_dataset(gm.make_corpus(20_000))
    mc = gm.GPTConfig(**GPT_CONFIG, vocab_size=tok.vocab_size)
    tc = gm.TrainConfig(steps=STEPS, batch_size=GLOBAL_BATCH, warmup_steps=2)
    model = gm.GPT(mc, generator=torch.Generator().manual_seed(0)).to(device)
    if mode == "fsdp":
        mesh = init_device_mesh(device.type, (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = gm.make_optimizer(model, tc)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = gm.lr_at(step, tc)
        x, y = gm.get_batch(train_ids, GLOBAL_BATCH, mc.block_size, g, torch.device("cpu"))
        if mode != "single":
            x, y = rank_share(x, rank, world), rank_share(y, rank, world)
        _, loss = model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip, foreach=True)
        opt.step()
        losses.append(_mean_over_ranks(loss, mode != "single"))
    return losses, full_state(model)


def _tensor_parallel(device, rank=0, world=1):
    """The MLP's first Linear column-wise, its second row-wise (or the
    replicated MLP when world is 1): output, gradients and the parameters
    after one SGD step, all gathered."""
    device = torch.device(device)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p)
    model = model.to(device)
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(model, init_device_mesh(device.type, (world,)),
                           {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2)).to(device)
    out = model(x)
    out.square().sum().backward()
    grads = {k: (p.grad.full_tensor() if world > 1 else p.grad).cpu() for k, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=0.01).step()
    return {"out": out.detach().cpu(), "grads": grads, "params": full_state(model)}


def _dtensor_basics(device, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh(device, (world,))
    rank = dist.get_rank()
    full = torch.arange(30, dtype=torch.float32).reshape(5, 6)  # 5 rows: uneven shards
    d0 = distribute_tensor(full.to(device), mesh, [Shard(0)])
    out = {
        "local shard(0)": d0.to_local().cpu(),
        "shard(0) full_tensor": d0.full_tensor().cpu(),
        "shard(0) -> replicate": d0.redistribute(mesh, [Replicate()]).to_local().cpu(),
        "shard(0) -> shard(1)": d0.redistribute(mesh, [Shard(1)]).to_local().cpu(),
        "shard(1) of a transposed view": distribute_tensor(full.t().to(device), mesh, [Shard(1)]).full_tensor().cpu(),
        "replicate -> shard(1)": distribute_tensor(full.to(device), mesh, [Replicate()])
        .redistribute(mesh, [Shard(1)]).to_local().cpu(),
        "partial -> replicate": DTensor.from_local(full.to(device) * (rank + 1), mesh, [Partial()])
        .redistribute(mesh, [Replicate()]).to_local().cpu(),
        "sharded matmul": (d0 @ distribute_tensor(full.t().to(device), mesh, [Replicate()])).full_tensor().cpu(),
    }
    partial = DTensor.from_local(full[:4].to(device) * (rank + 1), mesh, [Partial()])
    shard_of_partial = attempt(lambda: partial.redistribute(mesh, [Shard(0)]).to_local().cpu())
    return out, shard_of_partial


def _dtensor_random(world):
    """torch.distributed.tensor.rand sharded by rows: the values, and the
    neuron generator's offset before and after."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard

    mesh = init_device_mesh("neuron", (world,))
    torch.manual_seed(3)
    before = int(torch.neuron.get_rng_state()[8:].view(torch.int64))
    sharded = torch.distributed.tensor.rand(4, 3, device_mesh=mesh, placements=[Shard(0)])
    after = int(torch.neuron.get_rng_state()[8:].view(torch.int64))
    replicated = torch.distributed.tensor.rand(2, 3, device_mesh=mesh, placements=[Replicate()])
    return {"shard": sharded.to_local().cpu(), "full": sharded.full_tensor().cpu(),
            "replicated": replicated.to_local().cpu(), "offsets": (before, after)}


def _checkpoint(rank, world, directory):
    """FSDP2 model and AdamW state after one step on each device, saved with
    torch.distributed.checkpoint; then each checkpoint loaded into a model
    made from another seed on each device."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def made(device, seed):
        model = small_mlp(seed).to(device)
        fully_shard(model, mesh=init_device_mesh(device, (world,)))
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed + rank))
        model(x.to(device)).square().sum().backward()
        opt.step()
        return model, opt

    def state(model, opt):
        msd, osd = get_state_dict(model, opt)
        gathered = {k: v.full_tensor().cpu() for k, v in msd.items()}
        for pname, s in osd["state"].items():
            for k, v in s.items():
                gathered[f"optim {pname} {k}"] = (v.full_tensor() if hasattr(v, "full_tensor") else v).cpu()
        return msd, osd, gathered

    saved = {}
    for device in ("neuron", "cpu"):
        model, opt = made(device, 0)
        msd, osd, saved[device] = state(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(directory, device))
    loaded = {}
    for source in ("neuron", "cpu"):
        for device in ("neuron", "cpu"):
            model, opt = made(device, 5)
            msd, osd, _ = state(model, opt)
            sd = {"model": msd, "optim": osd}
            dcp.load(sd, checkpoint_id=os.path.join(directory, source))
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            placed = {k: (v.device.type, type(v).__name__) for k, v in model.state_dict().items()}
            loaded[source, device] = (state(model, opt)[2], placed)
    return {"saved": saved, "loaded": loaded}


def _mesh_facts(world):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("neuron", (world,))
    mesh2 = init_device_mesh("neuron", (1, world), mesh_dim_names=("dp", "tp"))
    return {"device_type": mesh.device_type, "shape": tuple(mesh.shape),
            "group size": mesh.get_group().size(),
            "2d": (mesh2.device_type, tuple(mesh2.shape), mesh2["tp"].size(), mesh2["dp"].size(),
                   mesh2["tp"].get_local_rank())}


def _worker(rank, world, port, directory):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.neuron.set_device(rank)
    dist.init_process_group("cpu:gloo,neuron:neuron", rank=rank, world_size=world)
    try:
        r = {"mesh": _mesh_facts(world),
             "default backend type": dist.distributed_c10d._get_default_group().name()}
        for device in ("neuron", "cpu"):
            r["fsdp mlp", device] = _train_mlp(device, "fsdp", rank, world)
            r["fsdp gpt", device] = _train_gpt(device, "fsdp", rank, world)
            bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                        reduce_dtype=torch.float32)
            r["fsdp mlp bf16", device] = _train_mlp(device, "fsdp", rank, world, mp_policy=bf16)
            r["tp", device] = _tensor_parallel(device, rank, world)
            r["dtensor", device] = _dtensor_basics(device, world)
        r["ddp mlp"] = _train_mlp("neuron", "ddp", rank, world)
        r["ddp gpt"] = _train_gpt("neuron", "ddp", rank, world)
        r["fsdp mlp offload"] = _train_mlp("neuron", "fsdp", rank, world, offload=True)
        r["random"] = _dtensor_random(world)
        r["dcp"] = _checkpoint(rank, world, directory)
        dist.barrier()
        return r
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return spawn_ranks(_worker, WORLD, str(tmp_path_factory.mktemp("dcp")))


def _assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def _assert_states_close(a, b, rtol, atol):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


# ------------------------------------------------------------------ FSDP2

def test_fsdp2_trains_as_one_process_on_the_global_batch(ranks):
    losses, params = _train_mlp("neuron", "single")
    for rank, r in ranks.items():
        got_losses, got_params = r["fsdp mlp", "neuron"]
        assert got_losses == pytest.approx(losses, rel=1e-6), rank
        _assert_states_close(got_params, params, rtol=1e-6, atol=1e-7)
        # FSDP2's reduce-scatter and DDP's all-reduce sum two ranks' gradients alike
        assert got_losses == r["ddp mlp"][0]
        _assert_states_equal(got_params, r["ddp mlp"][1])


def test_fsdp2_on_neuron_equals_fsdp2_on_the_cpu_bit_for_bit(ranks):
    for rank, r in ranks.items():
        for program in ("fsdp mlp", "fsdp gpt", "fsdp mlp bf16"):
            assert r[program, "neuron"][0] == r[program, "cpu"][0], (rank, program)
            _assert_states_equal(r[program, "neuron"][1], r[program, "cpu"][1])
    assert ranks[0]["fsdp gpt", "neuron"] [0] == ranks[1]["fsdp gpt", "neuron"][0]


def test_fsdp2_demo_gpt_against_ddp_and_one_process(ranks):
    losses, params = _train_gpt("neuron", "single")
    for rank, r in ranks.items():
        fsdp_losses, fsdp_params = r["fsdp gpt", "neuron"]
        ddp_losses, ddp_params = r["ddp gpt"]
        assert fsdp_losses == pytest.approx(losses, rel=1e-6)
        assert ddp_losses == pytest.approx(losses, rel=1e-6)
        # AdamW divides each gradient by its own running magnitude, so the
        # last bits of near-zero gradients (the gradient norm for clipping is
        # summed shard by shard under FSDP2) move parameters by up to lr times
        # a few 1e-4 of their update: an absolute tolerance on top of 1e-6.
        _assert_states_close(fsdp_params, params, rtol=1e-6, atol=1e-5)
        _assert_states_close(ddp_params, params, rtol=1e-6, atol=1e-5)
        _assert_states_close(fsdp_params, ddp_params, rtol=1e-6, atol=1e-5)


def test_fsdp2_mixed_precision_keeps_float32_parameters(ranks):
    for r in ranks.values():
        losses, params = r["fsdp mlp bf16", "neuron"]
        assert all(v.dtype == torch.float32 for v in params.values())
        assert losses != r["fsdp mlp", "neuron"][0]  # the forward ran in bfloat16


def test_fsdp2_cpu_offload_equals_no_offload(ranks):
    for r in ranks.values():
        assert r["fsdp mlp offload"][0] == r["fsdp mlp", "neuron"][0]
        _assert_states_equal(r["fsdp mlp offload"][1], r["fsdp mlp", "neuron"][1])


def test_a_group_of_gloo_and_neuron_has_the_neuron_backend_as_default(ranks):
    # PyTorch leaves UNDEFINED, a type no backend has (patch c10d-default-backend)
    assert all(r["default backend type"] == "custom" for r in ranks.values())


# ------------------------------------------------------------------ device mesh, DTensor

def test_init_device_mesh_on_neuron(ranks):
    for rank, r in ranks.items():
        m = r["mesh"]
        assert m["device_type"] == "neuron" and m["shape"] == (WORLD,) and m["group size"] == WORLD
        assert m["2d"] == ("neuron", (1, WORLD), WORLD, 1, rank)


def test_dtensor_on_neuron_equals_the_full_tensor_and_the_cpu_mesh(ranks):
    full = torch.arange(30, dtype=torch.float32).reshape(5, 6)
    for rank, r in ranks.items():
        nrn, _ = r["dtensor", "neuron"]
        cpu, _ = r["dtensor", "cpu"]
        assert nrn.keys() == cpu.keys()
        for k in nrn:
            assert torch.equal(nrn[k], cpu[k]), (rank, k)
        assert torch.equal(nrn["shard(0) full_tensor"], full)
        assert torch.equal(nrn["shard(0) -> replicate"], full)
        assert torch.equal(nrn["local shard(0)"], full.tensor_split(WORLD)[rank])
        assert torch.equal(nrn["shard(0) -> shard(1)"], full.tensor_split(WORLD, dim=1)[rank])
        assert torch.equal(nrn["shard(1) of a transposed view"], full.t())
        assert torch.equal(nrn["partial -> replicate"], full * sum(range(1, WORLD + 1)))
        assert torch.equal(nrn["sharded matmul"], full @ full.t())


def test_dtensor_partial_to_shard(ranks):
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for rank, r in ranks.items():
        got = value_of(r["dtensor", "neuron"][1])
        assert torch.equal(got, value_of(r["dtensor", "cpu"][1]))
        assert torch.equal(got, (full * 3).tensor_split(WORLD)[rank])


def test_dtensor_random_numbers_follow_the_offset_tracker(ranks):
    # OffsetBasedRNGTracker reads the neuron generator's state as (seed,
    # offset): a rank's shard is drawn at offset + its shard's first element
    # (rounded up to 4), and every rank ends at offset + numel.
    local_rows = 4 // WORLD
    for rank, r in ranks.items():
        rnd = r["random"]
        before, after = rnd["offsets"]
        assert after == before + 12
        torch.manual_seed(3)
        state = torch.neuron.get_rng_state()
        state[8:] = torch.tensor([before + (rank * local_rows * 3 + 3) // 4 * 4]).view(torch.uint8)
        torch.neuron.set_rng_state(state)
        assert torch.equal(rnd["shard"], torch.rand(local_rows, 3, device="neuron").cpu())
    assert torch.equal(ranks[0]["random"]["full"], ranks[1]["random"]["full"])
    assert not torch.equal(ranks[0]["random"]["shard"], ranks[1]["random"]["shard"])
    assert torch.equal(ranks[0]["random"]["replicated"], ranks[1]["random"]["replicated"])


# ------------------------------------------------------------------ tensor parallel

def test_tensor_parallel_against_replicated_and_the_cpu(ranks):
    ref = _tensor_parallel("neuron")
    for rank, r in ranks.items():
        tp, tp_cpu = r["tp", "neuron"], r["tp", "cpu"]
        # the row-wise Linear sums two partial products: the order of one sum differs
        torch.testing.assert_close(tp["out"], ref["out"], rtol=1e-6, atol=1e-5)
        _assert_states_close(tp["grads"], ref["grads"], rtol=1e-6, atol=1e-5)
        _assert_states_close(tp["params"], ref["params"], rtol=1e-6, atol=1e-6)
        assert torch.equal(tp["out"], tp_cpu["out"])
        _assert_states_equal(tp["grads"], tp_cpu["grads"])
        _assert_states_equal(tp["params"], tp_cpu["params"])


# ------------------------------------------------------------------ torch.distributed.checkpoint

def test_checkpoint_round_trip_equals_the_cpus(ranks):
    for rank, r in ranks.items():
        saved, loaded = r["dcp"]["saved"], r["dcp"]["loaded"]
        _assert_states_equal(saved["neuron"], saved["cpu"])
        assert any(k.startswith("optim ") for k in saved["cpu"])
        for (source, device), (state, placed) in loaded.items():
            _assert_states_equal(state, saved["cpu"])
            assert all(p == (device, "DTensor") for p in placed.values()), (source, device, placed)


def test_checkpoint_saved_on_neuron_reads_in_one_process(ranks, tmp_path_factory):
    # dcp_to_torch_save reads a sharded checkpoint without a process group
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    base = tmp_path_factory.getbasetemp()
    directory = next(p for p in base.iterdir() if p.name.startswith("dcp"))
    for device in ("neuron", "cpu"):
        dcp_to_torch_save(str(directory / device), str(base / f"{device}.pt"))
    nrn, cpu = (torch.load(base / f"{d}.pt", weights_only=False) for d in ("neuron", "cpu"))
    _assert_states_equal(nrn["model"], cpu["model"])
    expected = {k: v for k, v in ranks[0]["dcp"]["saved"]["cpu"].items() if not k.startswith("optim ")}
    _assert_states_equal(nrn["model"], expected)


# ------------------------------------------------------------------ a group bound to its device

def _bound_worker(rank, world, port):
    """init_process_group with device_id (as NCCL users pass it): DeviceMesh
    then makes the sub-groups of a 2-D mesh with split_group."""
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.neuron.set_device(rank)
    dist.init_process_group("neuron", rank=rank, world_size=world, device_id=torch.device("neuron", rank))
    try:
        def mesh_2d():
            mesh = init_device_mesh("neuron", (1, world), mesh_dim_names=("dp", "tp"))
            sums = {}
            for dim in ("dp", "tp"):
                t = torch.full((2,), float(rank + 1), device="neuron")
                dist.all_reduce(t, group=mesh[dim].get_group())
                sums[dim] = (mesh[dim].size(), t.cpu())
            return sums

        def split():
            alone = dist.split_group(split_ranks=[[r] for r in range(world)], timeout=timedelta(seconds=55))
            t = torch.full((2,), float(rank + 1), device="neuron")
            dist.all_reduce(t, group=alone)
            return {"size": alone.size(), "sum": t.cpu(),
                    "timeout": alone._get_backend(torch.device("neuron")).options._timeout}
        return {"bound": str(dist.distributed_c10d._get_default_group().bound_device_id),
                "1-d mesh": init_device_mesh("neuron", (world,)).size(),
                "2-d mesh": attempt(mesh_2d),
                "split_group": attempt(split)}
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def bound_ranks():
    return spawn_ranks(_bound_worker, WORLD)


def test_a_group_bound_to_its_device_makes_a_1d_mesh(bound_ranks):
    for rank, r in bound_ranks.items():
        assert r["bound"] == f"neuron:{rank}" and r["1-d mesh"] == WORLD


def test_a_group_bound_to_its_device_makes_a_2d_mesh_and_splits(bound_ranks):
    for rank, r in bound_ranks.items():
        sums = value_of(r["2-d mesh"])
        assert sums["dp"][0] == 1 and torch.equal(sums["dp"][1], torch.full((2,), rank + 1.0))
        assert sums["tp"][0] == WORLD and torch.equal(sums["tp"][1], torch.full((2,), 3.0))
        split = value_of(r["split_group"])
        assert split["size"] == 1 and torch.equal(split["sum"], torch.full((2,), rank + 1.0))
        assert split["timeout"] == timedelta(seconds=55)
