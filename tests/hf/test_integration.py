"""The Hugging Face stack on `neuron` without device arguments, and its gaps.

* `torch_neuronx`: the import name transformers and accelerate look for; its
  AWS functions (trace, replace_weights, analyze, DataParallel, placement),
  each against the same module on the CPU.
* `torch.neuron` has every function these libraries call on a device module
  (scanned from their installed source), with `torch.cuda`'s signatures.
* `Trainer`, `Accelerator` select `neuron` by themselves and train, evaluate,
  save and resume as on the CPU, bit for bit in float32.
* Each gap docs/huggingface.md lists: one test pins its workaround, one checks
  the gap is still there and fails, asking for the docs to be updated, when a
  library upgrade closes it.
"""
import copy
import inspect
import io
import os
import re
import warnings

import pytest
import torch

import torch_neuronx
import torchneuron
from neuron_testing import ROOT, SEED, run_python

from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState, GradientState, PartialState  # noqa: E402
from tokenizers import Tokenizer, models as tokenizer_models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

from torchneuron.huggingface import NEURON_RNG_STATE_FILE, NeuronRNGStateCallback  # noqa: E402

SITE_PACKAGES = os.path.dirname(os.path.dirname(inspect.getfile(torch)))
LIBRARIES = ("transformers", "accelerate", "peft", "sentence_transformers")
WORDS = "the a cat dog sat on mat ran fast slow big small red blue".split()
VOCAB = len(WORDS) + 2
GAP_CLOSED = ("the gap looks closed by a library upgrade: update docs/huggingface.md (drop the gap and its "
              "workaround) and this test")


def gap_still_there(condition: bool, gap: str) -> None:
    assert condition, f"{gap}: {GAP_CLOSED}"


class gap_raises:
    """``with gap_raises(ValueError, "pattern", "what fails"):`` the block must
    raise as the gap makes it; if it no longer raises, the gap has closed."""

    def __init__(self, exception: type, match: str, gap: str):
        self.exception, self.match, self.gap, self.value = exception, match, gap, None

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            pytest.fail(f"{self.gap} no longer raises: {GAP_CLOSED}")
        if not issubclass(kind, self.exception) or not re.search(self.match, str(value)):
            return False  # another error: let it through
        self.value = value
        return True


# ---------------------------------------------------------------- small models and data
def tiny_llama(attention_dropout: float = 0.0) -> LlamaForCausalLM:
    torch.manual_seed(SEED)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, attention_dropout=attention_dropout,
        pad_token_id=0, bos_token_id=2, eos_token_id=1))


def tiny_bert() -> BertModel:
    torch.manual_seed(SEED)
    return BertModel(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=32, pad_token_id=0))


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tokenizer = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]")


def token_rows(count: int, length: int = 8, seed: int = SEED) -> list[dict]:
    ids = torch.randint(2, VOCAB, (count, length), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def cpu_state(model: torch.nn.Module) -> dict:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def assert_states_equal(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    different = [k for k in expected if not torch.equal(actual[k], expected[k])]
    assert not different, f"tensors differ: {different}"


def reset_accelerate() -> None:
    """accelerate keeps its state per process (one device, one precision);
    each run here starts from none, as a new program would."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    reset_accelerate()
    yield
    reset_accelerate()


# ---------------------------------------------------------------- torch_neuronx
def test_torch_neuronx_is_this_project_and_registers_the_device():
    assert os.path.dirname(os.path.abspath(torch_neuronx.__file__)) == os.path.join(ROOT, "torch_neuronx")
    assert torch.neuron is torchneuron.neuron
    assert isinstance(torch_neuronx.__version__, str) and torch_neuronx.__version__
    # With autoload off, the libraries see no device until torch_neuronx is
    # imported; importing it (nothing else) registers neuron.
    result = run_python("""
        from transformers.utils import import_utils
        from accelerate.utils import imports
        before = (import_utils.is_torch_neuron_available(), imports.is_neuron_available())
        import torch, torch_neuronx
        import_utils.is_torch_neuron_available.cache_clear()  # both answers are cached per process
        imports.is_neuron_available.cache_clear()
        after = (import_utils.is_torch_neuron_available(), imports.is_neuron_available(),
                 import_utils.is_torch_neuron_available(check_device=True), imports.is_neuron_available(True),
                 torch.accelerator.current_accelerator().type)
        print(before, after)
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "(False, False) (True, True, True, True, 'neuron')"


def test_libraries_detect_neuron():
    from accelerate.utils import is_neuron_available
    from transformers.utils import import_utils

    assert import_utils.is_torch_neuron_available() and import_utils.is_torch_neuron_available(check_device=True)
    assert is_neuron_available() and is_neuron_available(check_device=True)
    assert import_utils.is_torch_bf16_gpu_available()  # TrainingArguments(bf16=True) asks it
    # The XLA-based Neuron stack (torch_xla + torch_neuronx) is another thing:
    # transformers gates its torch_xla code on it, which must stay off here.
    assert not import_utils.is_torch_neuroncore_available()
    assert TrainingArguments("unused", report_to=[], torch_compile=True).torch_compile_backend == "neuron"


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(6, 16), torch.nn.Linear(16, 3)

    def forward(self, x):
        return torch.log_softmax(self.fc2(torch.relu(self.fc1(x))), dim=-1)


def mlp_and_input(seed: int = SEED):
    torch.manual_seed(seed)
    return MLP(), torch.randn(5, 6)


def test_trace_runs_on_neuron_as_the_module_on_the_cpu():
    model, x = mlp_and_input()
    traced = torch_neuronx.trace(model, x)
    assert isinstance(traced, torch.jit.ScriptModule)
    assert next(model.parameters()).device.type == "cpu", "the caller's module must stay where it was"
    assert {p.device for p in traced.parameters()} == {torch.device("neuron", 0)}
    out = traced(x.to("neuron"))
    assert out.device.type == "neuron" and torch.equal(out.cpu(), model(x))
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    assert torch.equal(torch.jit.load(buffer)(x.to("neuron")).cpu(), model(x))
    on_cpu = torch_neuronx.trace(model, x, cpu_backend=True)
    assert next(on_cpu.parameters()).device.type == "cpu" and torch.equal(on_cpu(x), model(x))
    with torch.neuron.device(1):
        assert next(torch_neuronx.trace(model, x).parameters()).device == torch.device("neuron", 1)


def test_trace_arguments_without_a_meaning_here():
    model, x = mlp_and_input()
    with pytest.warns(UserWarning, match="compiler_args has no effect"):
        torch_neuronx.trace(model, x, compiler_args=["--auto-cast", "none"])
    with pytest.raises(NotImplementedError, match="nothing is partitioned"):
        torch_neuronx.trace(model, x, partitioner_config=object())
    with pytest.raises(NotImplementedError, match="keep state in neuron tensors"):
        torch_neuronx.trace(model, x, input_output_aliases={x: 0})
    with pytest.raises(TypeError):
        torch_neuronx.trace(model, x, None)


def test_replace_weights_and_placement_of_a_traced_module():
    model, x = mlp_and_input()
    other, _ = mlp_and_input(seed=SEED + 1)
    traced = torch_neuronx.trace(model, x, inline_weights_to_neff=False)
    torch_neuronx.replace_weights(traced, other)
    assert torch.equal(traced(x.to("neuron")).cpu(), other(x))
    torch_neuronx.replace_weights(traced, model.state_dict())
    assert torch.equal(traced(x.to("neuron")).cpu(), model(x))
    with pytest.raises(RuntimeError, match="Missing key"):
        torch_neuronx.replace_weights(traced, {"fc1.weight": model.fc1.weight})

    torch_neuronx.move_trace_to_device(traced, 1)
    assert {p.device for p in traced.parameters()} == {torch.device("neuron", 1)}
    torch_neuronx.experimental.set_neuron_cores(traced, 0)
    assert {p.device for p in traced.parameters()} == {torch.device("neuron", 0)}
    assert torch.equal(traced(x.to("neuron")).cpu(), model(x))
    assert torch_neuronx.dynamic_batch(traced) is traced
    assert torch.equal(traced(torch.cat([x, x]).to("neuron")).cpu(), model(torch.cat([x, x])))
    assert torch_neuronx.lazy_load(traced) is None and torch_neuronx.async_load(traced) is None
    with pytest.raises(TypeError, match="torch_neuronx.trace"):
        torch_neuronx.lazy_load(model)


def test_analyze_reports_the_operators_the_device_ran():
    model, x = mlp_and_input()
    report = torch_neuronx.analyze(model, x)
    # the same forward, counted by the device's own tracking
    torchneuron.clear_op_tracking()
    with torch.no_grad():
        copy.deepcopy(model).to("neuron")(x.to("neuron"))
    torch.neuron.synchronize()
    assert report["supported_operators"] == {"aten": torchneuron.get_executed_ops()}
    assert report["supported_operators"]["aten"]["aten::addmm"] == 2
    assert report["unsupported_operators"] == {"aten": []} and report["support_percentage"] == "100.00%"
    assert report["torch_neuronx_version"] == torch_neuronx.__version__
    ignored = torch_neuronx.analyze(model, x, additional_ignored_ops={"aten::relu"})
    assert "aten::relu" not in ignored["supported_operators"]["aten"]

    failing = torch_neuronx.analyze(lambda t: torch.relu(t) + torch.ones(6), x)  # a CPU tensor in the graph
    (entry,) = failing["unsupported_operators"]["aten"]
    assert entry["error"].startswith("RuntimeError") and "same device" in entry["error"]
    assert failing["supported_operators"]["aten"] == {"aten::relu": 1} and failing["support_percentage"] == "50.00%"


def test_data_parallel_splits_the_batch_across_devices():
    model, x = mlp_and_input()
    parallel = torch_neuronx.DataParallel(model)
    assert parallel.device_ids == list(range(torch.neuron.device_count()))
    assert [next(r.parameters()).device.index for r in parallel.replicas] == parallel.device_ids

    def by_chunks(rows):
        """The CPU's result on the same chunks the replicas get, each a tensor of its own as a replica's is:
        a matrix product's bits may depend on how many rows it has and on where they start (the CPU's GEMM
        picks its kernel by shape and alignment: a chunk viewed at an offset of 18 floats and its copy
        differ by an ulp)."""
        return torch.cat([model(c.clone()) for c in rows.chunk(len(parallel.device_ids))])

    out = parallel(x)  # 5 rows: uneven chunks
    assert out.device == torch.device("neuron", 0) and torch.equal(out.cpu(), by_chunks(x))
    assert torch.equal(parallel(x[:1]).cpu(), model(x[:1]))  # fewer rows than devices
    traced = torch_neuronx.DataParallel(torch_neuronx.trace(model, x), device_ids=[1, 0], dim=0)
    assert torch.equal(traced(x).cpu(), by_chunks(x))
    parallel.disable_dynamic_batching()
    with pytest.raises(ValueError, match="does not split evenly"):
        parallel(x)
    assert torch.equal(parallel(x[:4]).cpu(), by_chunks(x[:4]))
    with pytest.raises(ValueError, match="does not exist"):
        torch_neuronx.DataParallel(model, device_ids=[torch.neuron.device_count()])


def test_what_cannot_map_raises_naming_what_to_use():
    model, x = mlp_and_input()
    traced = torch_neuronx.trace(model, x)
    for call in (lambda: torch_neuronx.experimental.set_multicore(traced),
                 lambda: torch_neuronx.experimental.multicore_context(),
                 lambda: torch_neuronx.experimental.set_neuron_cores(traced, 0, 2)):
        with pytest.raises(NotImplementedError, match="torch_neuronx.DataParallel"):
            call()
    with pytest.raises(NotImplementedError, match="map_location"):
        torch_neuronx.experimental.neuron_cores_context(0)
    from torch_neuronx import xla_impl

    with pytest.raises(NotImplementedError, match="no XLA lazy-tensor layer"):
        xla_impl.trace
    assert not hasattr(xla_impl, "__wrapped__")  # introspection sees an ordinary module


# ---------------------------------------------------------------- torch.neuron: what the libraries call
DEVICE_MODULE_CALL = re.compile(r"\btorch\.(?:cuda|xpu|npu|mlu|musa|hpu|sdaa|neuron)\.(\w+)(?:\.(\w+))?")
# Called on some device module, and with no meaning on this one.
NOT_FOR_THIS_DEVICE = {
    "CUDAGraph": "graph capture: the device has none (torch.neuron.is_current_stream_capturing() is False)",
    "graph": "graph capture, as CUDAGraph",
    **{name: "legacy typed tensor classes (torch.FloatTensor & co.), for CUDA and XPU only"
       for name in ("FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor", "IntTensor",
                    "LongTensor")},
}


def _library_sources():
    for library in LIBRARIES:
        for directory, _, files in os.walk(os.path.join(SITE_PACKAGES, library)):
            if f"{os.sep}models{os.sep}" in directory + os.sep:  # model files use the device generically
                continue
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(directory, name), encoding="utf-8") as f:
                        yield os.path.relpath(os.path.join(directory, name), SITE_PACKAGES), f.read()


def test_device_module_has_every_function_the_libraries_call():
    """Every `torch.<device>.<name>` (and `.<name>.<attribute>`) that the
    libraries call for any device, and every `torch.accelerator.<name>`."""
    missing, accelerator_missing, seen = {}, {}, set()
    for path, source in _library_sources():
        for name, attribute in DEVICE_MODULE_CALL.findall(source):
            seen.add(name)
            if name in NOT_FOR_THIS_DEVICE:
                continue
            target = getattr(torch.neuron, name, None)
            if target is None or (attribute and inspect.ismodule(target) and not hasattr(target, attribute)):
                missing.setdefault(f"{name}.{attribute}" if target is not None else name, path)
        for name in re.findall(r"\btorch\.accelerator\.(\w+)", source):
            if not hasattr(torch.accelerator, name):
                accelerator_missing.setdefault(name, path)
    assert not missing, f"torch.neuron lacks what the libraries call (name: first caller): {missing}"
    assert not accelerator_missing, f"torch.accelerator lacks: {accelerator_missing}"
    assert {"random", "amp", "get_rng_state_all", "is_bf16_supported", "mem_get_info", "set_device"} <= seen
    stale = set(NOT_FOR_THIS_DEVICE) - seen
    assert not stale, f"no library calls these any more; drop them from NOT_FOR_THIS_DEVICE: {stale}"


ADDED_FOR_THE_LIBRARIES = ["reset_max_memory_allocated", "reset_max_memory_cached", "memory_cached",
                           "max_memory_cached", "is_current_stream_capturing", "is_bf16_supported", "mem_get_info",
                           "set_device", "empty_cache", "max_memory_allocated", "reset_peak_memory_stats",
                           "get_rng_state_all", "set_rng_state_all", "get_rng_state", "set_rng_state",
                           "manual_seed_all"]


@pytest.mark.parametrize("name", ADDED_FOR_THE_LIBRARIES)
def test_device_module_functions_have_cuda_signatures(name):
    def parameters(function):
        return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]

    assert parameters(getattr(torch.neuron, name)) == parameters(getattr(torch.cuda, name))
    if name in ("get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all", "manual_seed_all"):
        assert parameters(getattr(torch.neuron.random, name)) == parameters(getattr(torch.cuda.random, name))


def test_deprecated_memory_spellings_warn_and_act_as_cuda_documents():
    torch.neuron.empty_cache()
    held = torch.empty(1 << 20, device="neuron")
    del held
    torch.neuron.synchronize()
    assert torch.neuron.max_memory_allocated() >= 4 << 20
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.neuron.reset_max_memory_allocated()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()
    with pytest.warns(FutureWarning, match="memory_reserved"):
        assert torch.neuron.memory_cached() == torch.neuron.memory_reserved()
    with pytest.warns(FutureWarning, match="max_memory_reserved"):
        assert torch.neuron.max_memory_cached() == torch.neuron.max_memory_reserved()
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.neuron.reset_max_memory_cached()
    assert torch.neuron.max_memory_reserved() == torch.neuron.memory_reserved()
    assert torch.neuron.is_current_stream_capturing() is False


def test_random_and_amp_submodules_are_the_device_generic_api():
    generators = torch.neuron.default_generators
    assert len(generators) == torch.neuron.device_count()
    for i, generator in enumerate(generators):  # each is the generator device i draws from
        generator.manual_seed(SEED + i)
        draws = torch.rand(4, device=f"neuron:{i}")
        torch.neuron.default_generator(i).manual_seed(SEED + i)
        assert torch.equal(torch.rand(4, device=f"neuron:{i}"), draws)
    torch.neuron.random.manual_seed_all(SEED)
    assert all(torch.equal(a, b) for a, b in zip(torch.neuron.random.get_rng_state_all(),
                                                  torch.neuron.get_rng_state_all()))
    draws = torch.rand(4, device="neuron")
    torch.neuron.random.manual_seed_all(SEED)
    assert torch.equal(torch.rand(4, device="neuron"), draws)

    a, b = torch.randn(8, 8, device="neuron"), torch.randn(8, 8, device="neuron")
    with pytest.warns(FutureWarning, match=r"torch\.amp\.autocast\('neuron'"):
        context = torch.neuron.amp.autocast(dtype=torch.bfloat16)
    with context:
        low = a @ b
    with torch.autocast("neuron", dtype=torch.bfloat16):
        expected = a @ b
    assert low.dtype == torch.bfloat16 and torch.equal(low, expected)
    with pytest.warns(FutureWarning, match=r"torch\.amp\.GradScaler\('neuron'"):
        scaler = torch.neuron.amp.GradScaler(init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == "neuron" and scaler.get_scale() == 8.0


# ---------------------------------------------------------------- Trainer
def trainer_arguments(output_dir, **overrides) -> TrainingArguments:
    settings = dict(output_dir=str(output_dir), report_to=[], per_device_train_batch_size=2,
                    per_device_eval_batch_size=4, gradient_accumulation_steps=2, max_steps=4, learning_rate=3e-3,
                    logging_steps=1, save_strategy="no", disable_tqdm=True, seed=SEED)
    settings.update(overrides)
    return TrainingArguments(**settings)


def train_with_trainer(output_dir, model, resume=None, callbacks=None, **overrides):
    reset_accelerate()
    trainer = Trainer(model=model, args=trainer_arguments(output_dir, **overrides), train_dataset=token_rows(16),
                      eval_dataset=token_rows(8, seed=SEED + 1), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer, losses, trainer.evaluate()["eval_loss"]


def test_trainer_selects_neuron_and_trains_as_on_the_cpu(tmp_path):
    """No device argument: the Trainer trains on neuron, float32 eager, with
    gradient accumulation, bit for bit as the same Trainer on the CPU."""
    model = tiny_llama()
    trainer, losses, eval_loss = train_with_trainer(tmp_path / "neuron", model)
    assert trainer.args.device == torch.device("neuron", 0) and model.device.type == "neuron"
    assert trainer.accelerator.device.type == "neuron"
    cpu_model = tiny_llama()
    _, cpu_losses, cpu_eval_loss = train_with_trainer(tmp_path / "cpu", cpu_model, use_cpu=True)
    assert cpu_model.device.type == "cpu"
    assert losses == cpu_losses and eval_loss == cpu_eval_loss
    assert_states_equal(cpu_state(model), cpu_state(cpu_model))


def test_trainer_bf16_gradient_accumulation_evaluate_save_and_resume(tmp_path):
    """bf16 autocast on neuron with gradient accumulation; a run resumed from
    its checkpoint ends bit for bit where the uninterrupted run ends (with
    dropout: the neuron generators' states travel with the checkpoint by the
    callback, the documented workaround of the Trainer's gap)."""
    settings = dict(bf16=True, max_steps=6, save_strategy="steps", save_steps=3, eval_strategy="steps",
                    eval_steps=3)
    full_model = tiny_llama(attention_dropout=0.25)
    trainer, full_losses, full_eval = train_with_trainer(tmp_path / "run", full_model,
                                                         callbacks=[NeuronRNGStateCallback()], **settings)
    assert trainer.accelerator.mixed_precision == "bf16" and trainer.accelerator.native_amp
    assert full_model.dtype == torch.float32 and full_model.device.type == "neuron"
    checkpoint = tmp_path / "run" / "checkpoint-3"
    assert (checkpoint / NEURON_RNG_STATE_FILE).is_file()
    # bf16 on neuron against float32 on neuron: the same training, within bf16's precision
    _, fp32_losses, _ = train_with_trainer(tmp_path / "fp32", tiny_llama(attention_dropout=0.25),
                                           **{**settings, "bf16": False, "save_strategy": "no"})
    assert torch.allclose(torch.tensor(full_losses), torch.tensor(fp32_losses), rtol=2e-2)

    resumed_model = tiny_llama(attention_dropout=0.25)
    _, resumed_losses, resumed_eval = train_with_trainer(tmp_path / "run", resumed_model, resume=str(checkpoint),
                                                         callbacks=[NeuronRNGStateCallback()], **settings)
    assert resumed_losses[-3:] == full_losses[-3:] and resumed_eval == full_eval
    assert_states_equal(cpu_state(resumed_model), cpu_state(full_model))


def test_gap_trainer_saves_no_neuron_rng_state(tmp_path):
    settings = dict(max_steps=4, save_strategy="steps", save_steps=2)
    full_model = tiny_llama(attention_dropout=0.25)
    train_with_trainer(tmp_path / "run", full_model, **settings)
    checkpoint = tmp_path / "run" / "checkpoint-2"
    states = torch.load(checkpoint / "rng_state.pth", weights_only=False)
    gap_still_there("cpu" in states and not any("neuron" in key for key in states),
                    "Trainer's rng_state.pth holds no neuron generator state")
    resumed_model = tiny_llama(attention_dropout=0.25)
    train_with_trainer(tmp_path / "run", resumed_model, resume=str(checkpoint), **settings)
    gap_still_there(not torch.equal(resumed_model.lm_head.weight.cpu(), full_model.lm_head.weight.cpu()),
                    "a resumed Trainer run with dropout on neuron differs from the uninterrupted run")


# ---------------------------------------------------------------- Accelerator
def accelerate_steps(accelerator, model, optimizer, batches):
    for batch in batches:
        loss = model(**{k: v.to(accelerator.device) for k, v in batch.items()}).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return loss.detach().cpu()


def batches(count: int, seed: int = SEED):
    rows = token_rows(2 * count, seed=seed)
    return [{k: torch.stack([r[k] for r in rows[2 * i:2 * i + 2]]) for k in rows[0]} for i in range(count)]


def test_accelerator_selects_neuron_and_trains_as_on_the_cpu():
    """prepare(model, optimizer) with the optimizer made before the move."""
    results = {}
    for device in ("neuron", "cpu"):
        reset_accelerate()
        accelerator = Accelerator(cpu=device == "cpu")
        assert accelerator.device.type == device
        model = tiny_llama()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model, optimizer = accelerator.prepare(model, optimizer)
        assert next(model.parameters()).device.type == device
        loss = accelerate_steps(accelerator, model, optimizer, batches(4))
        results[device] = (loss, cpu_state(accelerator.unwrap_model(model)))
    assert torch.equal(results["neuron"][0], results["cpu"][0])
    assert_states_equal(results["neuron"][1], results["cpu"][1])


def test_accelerator_save_state_and_load_state_resume_exactly(tmp_path):
    """With dropout: accelerate saves and restores the neuron generators."""
    def setup():
        reset_accelerate()
        accelerator = Accelerator()
        model = tiny_llama(attention_dropout=0.25)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        return accelerator, *accelerator.prepare(model, optimizer)

    accelerator, model, optimizer = setup()
    accelerate_steps(accelerator, model, optimizer, batches(2))
    accelerator.save_state(str(tmp_path / "state"))
    accelerate_steps(accelerator, model, optimizer, batches(2, seed=SEED + 1))
    expected = cpu_state(accelerator.unwrap_model(model))

    accelerator, model, optimizer = setup()
    accelerator.load_state(str(tmp_path / "state"))
    accelerate_steps(accelerator, model, optimizer, batches(2, seed=SEED + 1))
    assert_states_equal(cpu_state(accelerator.unwrap_model(model)), expected)


def test_gap_accelerate_refuses_fp16_on_neuron(tmp_path):
    with gap_raises(ValueError, "fp16 mixed precision requires a device .*'neuron'",
                    "Accelerator(mixed_precision='fp16') on neuron"):
        Accelerator(mixed_precision="fp16")
    reset_accelerate()
    with gap_raises(ValueError, "fp16 mixed precision requires a device", "Trainer(fp16=True) on neuron"):
        Trainer(model=tiny_llama(), args=trainer_arguments(tmp_path, fp16=True), train_dataset=token_rows(4))


def test_fp16_workaround_autocast_and_grad_scaler_on_neuron():
    """The workaround: torch.autocast('neuron', float16) with
    torch.amp.GradScaler('neuron'). The scaler's decisions (skipped steps,
    scale updates) are the CPU scaler's, bit for bit, on the same gradients;
    autocast computes in float16."""
    results = {}
    for device in ("neuron", "cpu"):
        model = tiny_llama().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**40, growth_interval=2)  # first steps overflow
        scales = []
        for batch in batches(6):
            loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            scales.append(scaler.get_scale())
        results[device] = (scales, cpu_state(model))
    assert results["neuron"][0] == results["cpu"][0] and len(set(results["cpu"][0])) > 2
    assert_states_equal(results["neuron"][1], results["cpu"][1])

    model = tiny_llama().to("neuron")
    with torch.autocast("neuron", dtype=torch.float16):
        logits = model(input_ids=batches(1)[0]["input_ids"].to("neuron")).logits
    assert logits.dtype == torch.float16


# ---------------------------------------------------------------- pipeline, sentence-transformers, peft
def saved_llama(tmp_path):
    path = str(tmp_path / "llama")
    tiny_llama().save_pretrained(path)
    word_tokenizer().save_pretrained(path)
    return path


def test_pipeline_on_neuron_generates_the_cpus_tokens(tmp_path):
    from transformers import pipeline

    path = saved_llama(tmp_path)
    generated = {}
    for device in ("neuron", "cpu"):
        pipe = pipeline("text-generation", model=path, device=device)
        assert pipe.device.type == device and pipe.model.device.type == device
        generated[device] = pipe("the cat sat", max_new_tokens=6, do_sample=False, return_tensors=True)
    assert generated["neuron"] == generated["cpu"]
    assert len(generated["cpu"][0]["generated_token_ids"]) == 3 + 6
    # the other workaround: device_map places the model, and the pipeline keeps it there
    assert pipeline("text-generation", model=path, device_map="neuron").device.type == "neuron"


def test_gap_pipeline_without_a_device_runs_on_the_cpu(tmp_path):
    from transformers import pipeline

    path = saved_llama(tmp_path)
    gap_still_there(pipeline("text-generation", model=path).device.type == "cpu",
                    "pipeline() without device= does not select neuron")
    model = LlamaForCausalLM.from_pretrained(path).to("neuron")
    pipe = pipeline("text-generation", model=model, tokenizer=word_tokenizer())
    gap_still_there(pipe.device.type == "cpu" and model.device.type == "cpu",
                    "pipeline() without device= moves a model on neuron to the CPU")


def saved_sentence_encoder(tmp_path):
    path = str(tmp_path / "bert")
    tiny_bert().save_pretrained(path)
    word_tokenizer().save_pretrained(path)
    return path


def sentence_transformer(path, **kwargs):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    return SentenceTransformer(modules=[Transformer(path), Pooling(32)], **kwargs)


def test_sentence_transformers_on_neuron_encodes_as_on_the_cpu(tmp_path):
    path = saved_sentence_encoder(tmp_path)
    sentences = ["the cat sat on the mat", "a big red dog ran fast", "blue"]
    on_neuron = sentence_transformer(path, device="neuron")
    assert on_neuron.device.type == "neuron"
    embeddings = on_neuron.encode(sentences, convert_to_tensor=True)
    assert embeddings.device.type == "neuron"
    expected = sentence_transformer(path, device="cpu").encode(sentences, convert_to_tensor=True)
    assert torch.equal(embeddings.cpu(), expected)


def test_gap_sentence_transformers_default_device_is_the_cpu(tmp_path):
    from sentence_transformers.util import get_device_name

    gap_still_there(get_device_name() == "cpu", "sentence-transformers' get_device_name() does not name neuron")
    gap_still_there(sentence_transformer(saved_sentence_encoder(tmp_path)).device.type == "cpu",
                    "SentenceTransformer() without device= does not select neuron")


def test_gap_peft_infer_device_is_the_cpu(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from peft.utils.other import infer_device

    gap_still_there(infer_device() == "cpu", "peft's infer_device() does not name neuron")
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapter = get_peft_model(tiny_llama(), lora)
    adapter.save_pretrained(str(tmp_path / "adapter"))
    # The workaround: leave torch_device unset; the adapter is read on the CPU
    # and copied into the model on neuron.
    loaded = PeftModel.from_pretrained(tiny_llama().to("neuron"), str(tmp_path / "adapter"))
    assert {p.device.type for p in loaded.parameters()} == {"neuron"}
    x = batches(1)[0]["input_ids"]
    assert torch.equal(loaded(input_ids=x.to("neuron")).logits.cpu(), adapter(input_ids=x).logits)
    with gap_raises(Exception, "device neuron is invalid", "PeftModel.from_pretrained(torch_device='neuron')"):
        PeftModel.from_pretrained(tiny_llama().to("neuron"), str(tmp_path / "adapter"), torch_device="neuron")


# ---------------------------------------------------------------- safetensors, device_map="auto"
def test_gap_safetensors_rejects_device_neuron(tmp_path):
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    tensors = {"weight": torch.randn(4, 3), "ids": torch.arange(5)}
    save_file(tensors, str(tmp_path / "t.safetensors"))
    with gap_raises(SafetensorError, "device neuron is invalid", "safetensors load_file(device='neuron')"):
        load_file(str(tmp_path / "t.safetensors"), device="neuron")
    # the workaround: read on the CPU, then move
    loaded = {k: v.to("neuron") for k, v in load_file(str(tmp_path / "t.safetensors")).items()}
    assert all(v.device.type == "neuron" and torch.equal(v.cpu(), tensors[k]) for k, v in loaded.items())
    # writing tensors that live on neuron works (safetensors copies them to the CPU)
    save_file(loaded, str(tmp_path / "from_neuron.safetensors"))
    assert all(torch.equal(v, tensors[k]) for k, v in load_file(str(tmp_path / "from_neuron.safetensors")).items())


def test_gap_accelerate_get_max_memory_and_device_map_auto(tmp_path):
    from accelerate.utils import get_max_memory

    path = saved_llama(tmp_path)
    budget = get_max_memory()
    gap_still_there(set(budget) == {"cpu"}, "accelerate's get_max_memory() lists no neuron device")
    gap_still_there(LlamaForCausalLM.from_pretrained(path, device_map="auto").device.type == "cpu",
                    "from_pretrained(device_map='auto') does not place on neuron")
    with gap_raises(ValueError, "Device neuron is not recognized", "get_max_memory({'neuron': ...})"):
        get_max_memory({"neuron": "1GB", "cpu": "1GB"})
    # the workarounds: name the device, or give neuron devices' budgets by index
    expected = cpu_state(LlamaForCausalLM.from_pretrained(path))
    for device_map, max_memory in (({"": "neuron"}, None), ("neuron", None), ("auto", {0: "1GB", "cpu": "1GB"})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # accelerate warns that it counts no device 0
            model = LlamaForCausalLM.from_pretrained(path, device_map=device_map, max_memory=max_memory)
        assert {p.device for p in model.parameters()} == {torch.device("neuron", 0)}, device_map
        assert_states_equal(cpu_state(model), expected)


# ---------------------------------------------------------------- the example
def test_example_fine_tunes_on_neuron_and_plots_the_loss(tmp_path):
    """examples/hf_finetune.py, shortened: no device in the script, the Trainer
    picks neuron, the loss falls, the plot is written."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "hf_finetune.py"), "--max-steps", "30",
                             "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Trainer device: neuron:0" in result.stdout
    loss, uniform = map(float, re.search(r"evaluation loss ([\d.]+) \(a uniform guess over the vocabulary: "
                                          r"([\d.]+)\)", result.stdout).groups())
    assert loss < 0.6 * uniform
    assert (tmp_path / "hf_finetune_loss.png").stat().st_size > 10_000
    with open(os.path.join(ROOT, "examples", "hf_finetune.py"), encoding="utf-8") as f:
        script = f.read()
    assert not re.search(r"""["'](neuron|cpu|cuda)\b|\.neuron\(|torch\.neuron|use_cpu""", script), \
        "the example names a device"
