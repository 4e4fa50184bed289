"""Estimates of steps the twin has not run (torchneuron/target/estimate.py): a compiled
step's estimate agrees with what the live twin charges for the same step under
torch.compile(backend="neuron"); the eager estimate with the live twin's eager charges;
FLOPs follow the 6 x parameters x tokens rule; a model on the meta device is costed
without memory, and a deep model from its one- and two-layer builds."""
import pytest
import torch

import torchneuron.target as target
from torchneuron.target import figures
from torchneuron.target.estimate import estimate, estimate_layers

DEV = "neuron"


def mlp(device, width=64, depth=3):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(device)


class Regression(torch.nn.Module):
    """An MLP with its loss, so one call is a whole training step's forward."""

    def __init__(self, device):
        super().__init__()
        self.net = mlp(device)

    def forward(self, x):
        return self.net(x).square().mean()


def live_charges(model, x):
    """(compiled graph seconds in compile order, eager seconds, eager launches) the live
    twin charges for one training step (gradients of the parameters)."""
    params = list(model.parameters())
    target.enable("trn2", lnc=2)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend="neuron")
        torch.autograd.grad(compiled(x), params)  # compiles
        with target.measure() as w:
            torch.autograd.grad(compiled(x), params)
        graphs = sorted((o for o in w.summary["top_ops"] if o["op"].startswith("compiled graph")),
                        key=lambda o: o["op"].rsplit("_", 1)[-1])  # forward first: its number is lower
        with target.measure() as eager:
            torch.autograd.grad(model(x), params)
        launches_s = eager.summary["device_s"] - eager.summary["bound_s"].get("host", 0.0)  # without host waits
        return [o["seconds"] for o in graphs], launches_s, eager.summary["launches"]
    finally:
        target.disable()
        torch._dynamo.reset()


def test_the_estimate_of_a_compiled_step_is_what_the_live_twin_charges():
    x = torch.randn(32, 64)
    graphs, eager_s, launches = live_charges(Regression(DEV), x.to(DEV))
    with torch.device("meta"):
        model = Regression("meta")
    e = estimate(model, {"x": x.to("meta")}, backward=True, target="trn2", lnc=2)
    assert len(e.graphs) == len(graphs) == 2  # forward and backward, each one launch
    # Each graph as the live twin charges it. (A step whose backward makes constant fills,
    # as a cross-entropy's zeros, differs by those: the live backend folds them into graph
    # inputs, the estimate keeps them in the graph; a percent on a tiny Llama.)
    for est, live in zip(e.graphs, graphs):
        assert est.seconds == pytest.approx(live, rel=1e-6)
    # Eager: the same operators, each one launch.
    assert e.eager_launches == launches
    assert e.eager_s == pytest.approx(eager_s, rel=1e-6)
    assert e.eager_s > e.compiled_s  # launch-bound: one launch per operator against two


def test_flops_of_a_linear_stack_follow_the_six_n_tokens_rule():
    width, depth, tokens = 256, 4, 128

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(depth)])

        def forward(self, x):
            return self.layers(x).sum()

    with torch.device("meta"):
        model = Stack()
    x = torch.empty(tokens, width, device="meta")
    e = estimate(model, {"x": x}, backward=True, compiled=False)
    n = sum(p.numel() for p in model.parameters())
    # 2N per token forward, 4N backward (input and weight gradients), except that nothing
    # asks for the first layer's input gradient: 6NT less 2T x its weights.
    assert e.flops == 6 * n * tokens - 2 * tokens * width * width
    assert e.flops == pytest.approx(6 * n * tokens, rel=1 / (3 * depth))
    forward = estimate(model, {"x": x}, compiled=False)
    assert forward.flops == 2 * n * tokens


def llama(layers):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      attn_implementation="eager")
    with torch.device("meta"):
        return LlamaForCausalLM(cfg).to(torch.bfloat16)


def test_a_llama_on_the_meta_device_is_costed_and_deep_models_extrapolate_from_two_builds():
    ids = torch.zeros(2, 64, dtype=torch.long, device="meta")
    kwargs = {"input_ids": ids, "labels": ids, "use_cache": False}
    three = estimate(llama(3), kwargs, backward=True, target="trn3", compiled=False)
    extrapolated = estimate_layers(lambda n: (llama(n), kwargs), 3, backward=True, target="trn3", compiled=False)
    assert extrapolated.flops == three.flops
    assert extrapolated.eager_launches == three.eager_launches
    assert extrapolated.eager_s == pytest.approx(three.eager_s, rel=1e-9)
    # Training FLOPs: 6 x the matrix parameters x tokens, plus attention's scores and mixing.
    model = llama(3)
    matrix = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name)
    tokens = ids.numel()
    assert three.flops == pytest.approx(6 * matrix * tokens, rel=0.1)
    assert three.flops > 6 * matrix * tokens
    # bf16 on Trainium3: the matrix work alone takes at least its FLOPs at the bf16 peak.
    core = figures.logical_core("trn3", 2)
    assert three.eager_s > three.flops / core.tensor_flops_per_s("bf16")
