"""``torch_neuronx.xla_impl``: in AWS's package, the torch-xla implementation
behind trace and training (lazy tensors, graph lowering, NEFF handling).

This device has no XLA layer: tensors on ``neuron`` run eagerly, operator by
operator, and ``torch.compile(backend="neuron")`` compiles graphs. So every
attribute of this module raises ``NotImplementedError`` saying what to use.
"""

_INSTEAD = ("torchneuron has no XLA lazy-tensor layer: move tensors and modules with .to('neuron') (they run "
            "eagerly), compile with torch.compile(model, backend='neuron'), and trace for inference with "
            "torch_neuronx.trace")


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):  # import machinery and introspection probe dunders
        raise AttributeError(name)
    raise NotImplementedError(f"torch_neuronx.xla_impl.{name}: {_INSTEAD}")
