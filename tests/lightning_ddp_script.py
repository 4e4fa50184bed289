"""Lightning DDP on two ``neuron`` devices, for tests/test_lightning.py.

``python tests/lightning_ddp_script.py OUT`` trains the test's model with
``Trainer(accelerator="neuron", devices=2, strategy="ddp_neuron")``. Lightning's
launcher starts rank 1 by running this script again (``LOCAL_RANK=1``); each
rank saves its losses, final parameters and what it ran on to ``OUT/rank<r>.pt``,
and what ``Trainer(accelerator="neuron")`` did before torchneuron.lightning was imported.
"""
import sys

import torch
import torch.distributed as dist
import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset

# before the import below: does Lightning find "neuron" by itself (an entry point)?
try:
    pl.Trainer(accelerator="neuron", logger=False)
    WITHOUT_IMPORT = "accepted"
except ValueError as error:
    WITHOUT_IMPORT = f"refused: {error}"

import torchneuron.lightning  # noqa: E402,F401  registers "neuron" and "ddp_neuron"

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_lightning import BATCH, STEPS, Regressor, dataset  # noqa: E402


class Record(pl.Callback):
    def on_train_end(self, trainer, module):
        self.backend = dist.get_backend()
        self.world_size = dist.get_world_size()


def main(out: str) -> None:
    torch.manual_seed(0)
    module = Regressor()
    record = Record()
    trainer = pl.Trainer(accelerator="neuron", devices=2, strategy="ddp_neuron", max_steps=STEPS, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[record])
    trainer.fit(module, DataLoader(TensorDataset(*dataset()), batch_size=BATCH))
    torch.save({"losses": torch.stack(module.losses), "params": [p.detach().cpu() for p in module.parameters()],
                "step_devices": sorted({str(d) for d in module.matmul_devices}), "root_device": str(trainer.strategy.root_device),
                "strategy": type(trainer.strategy).__name__, "backend": record.backend,
                "world_size": record.world_size, "without_import": WITHOUT_IMPORT}, f"{out}/rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1])
