"""``torch.neuron.random``: the generator functions under ``torch.cuda.random``'s
names (transformers' Trainer restores a device's state through
``<device module>.random.set_rng_state[_all]``). They are the functions of
``torch.neuron`` itself (__init__.py), so either spelling acts on the same
per-device generators."""
from . import (  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)

__all__ = ["get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "manual_seed",
           "manual_seed_all", "seed", "seed_all", "initial_seed"]
