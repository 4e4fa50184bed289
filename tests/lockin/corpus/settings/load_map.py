"""torch.load(map_location="cuda") of a checkpoint, the device from the CUDA check."""
import os
import tempfile

import torch

path = os.path.join(tempfile.mkdtemp(), "ck.pt")
torch.manual_seed(0)
torch.save({"w": torch.randn(3)}, path)
location = "cuda" if torch.cuda.is_available() else "cpu"
state = torch.load(path, map_location=location)
print([round(v, 4) for v in state["w"].tolist()])
