"""Sample from a saved checkpoint (nanoGPT's sample.py style): the checkpoint is written first."""
import os
import tempfile
from contextlib import nullcontext

import torch
import torch.nn as nn

device = "cuda"  # ties: TNL003
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"  # ties: TNL004
torch.manual_seed(1337)
torch.cuda.manual_seed(1337)  # ties: TNL004
torch.backends.cuda.matmul.allow_tf32 = True  # ties: TNL008
torch.backends.cudnn.allow_tf32 = True  # ties: TNL007
device_type = "cuda" if "cuda" in device else "cpu"  # ties: TNL003
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

ckpt_path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
trained = nn.Sequential(nn.Embedding(13, 8), nn.Linear(8, 13)).to(device)
torch.save({"model": trained.state_dict()}, ckpt_path)

checkpoint = torch.load(ckpt_path, map_location=device)
model = nn.Sequential(nn.Embedding(13, 8), nn.Linear(8, 13))
model.load_state_dict(checkpoint["model"])
model.eval()
model.to(device)

idx = torch.zeros((1, 1), dtype=torch.long, device=device)
with torch.no_grad():
    with ctx:
        for _ in range(5):
            logits = model(idx[:, -1:])[:, -1, :].float()
            idx = torch.cat((idx, torch.multinomial(torch.softmax(logits, dim=-1), 1)), dim=1)
print(idx.shape)
