"""Greedy generation with a key-value cache made on the GPU (Meta's llama generation.py style); model
parallel set up only when torchrun starts several processes."""
import os
import tempfile

import torch
import torch.nn as nn


def setup_model_parallel():
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    world_size = int(os.environ.get("WORLD_SIZE", -1))
    torch.distributed.init_process_group("nccl")  # ties: TNL010
    torch.cuda.set_device(local_rank)  # ties: TNL004
    torch.set_default_tensor_type(torch.cuda.HalfTensor)  # ties: TNL021
    return local_rank, world_size


class Attention(nn.Module):
    def __init__(self, dim, max_batch_size, max_seq_len):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.cache_k = torch.zeros((max_batch_size, max_seq_len, dim)).cuda()  # ties: TNL001
        self.cache_v = torch.zeros((max_batch_size, max_seq_len, dim)).cuda()  # ties: TNL001

    def forward(self, x, start_pos):
        bsz, seqlen, _ = x.shape
        self.cache_k = self.cache_k.to(x)
        self.cache_v = self.cache_v.to(x)
        self.cache_k[:bsz, start_pos:start_pos + seqlen] = self.wk(x)
        self.cache_v[:bsz, start_pos:start_pos + seqlen] = self.wv(x)
        keys, values = self.cache_k[:bsz, :start_pos + seqlen], self.cache_v[:bsz, :start_pos + seqlen]
        scores = (self.wq(x) @ keys.transpose(1, 2)).softmax(-1)
        return scores @ values


def load(ckpt_dir):
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        setup_model_parallel()
    torch.manual_seed(1)
    model = nn.ModuleDict({"emb": nn.Embedding(11, 8), "attn": Attention(8, 1, 6), "out": nn.Linear(8, 11)})
    path = os.path.join(ckpt_dir, "consolidated.00.pth")
    torch.save(model.state_dict(), path)
    checkpoint = torch.load(path, map_location="cpu")
    model.load_state_dict(checkpoint, strict=False)
    return model


model = load(tempfile.mkdtemp())
tokens = torch.full((1, 6), 0).cuda().long()  # ties: TNL001
tokens[0, 0] = 3
model = model.to(tokens.device)
with torch.inference_mode():
    for cur_pos in range(1, 6):
        h = model["attn"](model["emb"](tokens[:, cur_pos - 1:cur_pos]), cur_pos - 1)
        tokens[0, cur_pos] = model["out"](h)[0, -1].argmax()
print(tokens.tolist())
