"""What Hugging Face libraries lack for ``neuron`` and a program can add without
changing them (docs/huggingface.md lists every gap).

Importing this module imports transformers.
"""
from __future__ import annotations

import os
import warnings

import torch
from transformers import TrainerCallback

#: the file, in each checkpoint folder, that holds torch.neuron's generator states
NEURON_RNG_STATE_FILE = "rng_state_neuron.pth"


class NeuronRNGStateCallback(TrainerCallback):
    """Saves the ``neuron`` generators' states with each ``Trainer`` checkpoint and restores them on resume.

    transformers' ``Trainer`` saves and restores the generator states of the
    CPU and of the devices it knows (``rng_state.pth``), not ``neuron``'s, so a
    resumed run whose model draws random numbers on the device (dropout) takes
    other draws than an uninterrupted one. With this callback
    (``Trainer(..., callbacks=[NeuronRNGStateCallback()])``) each checkpoint
    also holds ``torch.neuron.get_rng_state_all()`` in
    :data:`NEURON_RNG_STATE_FILE`, and a run resumed from a checkpoint starts
    from those states, so it continues as the uninterrupted run did.

    The checkpoint of a resumed run is found as the ``Trainer`` names it,
    ``<output_dir>/checkpoint-<global step>``; pass ``checkpoint`` when
    resuming from a folder elsewhere.
    """

    def __init__(self, checkpoint: str | os.PathLike | None = None):
        self.checkpoint = checkpoint

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(folder):
            name = NEURON_RNG_STATE_FILE if args.world_size <= 1 else \
                f"rng_state_neuron_{args.process_index}.pth"
            torch.save(torch.neuron.get_rng_state_all(), os.path.join(folder, name))

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:  # a new run, not a resumed one
            return
        folder = self.checkpoint or os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        name = NEURON_RNG_STATE_FILE if args.world_size <= 1 else f"rng_state_neuron_{args.process_index}.pth"
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            warnings.warn(f"NeuronRNGStateCallback: no {name} in {folder}; the neuron generators are not restored, "
                          "so random draws on the device differ from the uninterrupted run", stacklevel=2)
            return
        torch.neuron.set_rng_state_all(torch.load(path, weights_only=True))


__all__ = ["NeuronRNGStateCallback", "NEURON_RNG_STATE_FILE"]
