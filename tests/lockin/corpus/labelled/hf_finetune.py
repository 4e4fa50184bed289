"""Fine-tune a causal language model with transformers, placed by device_map on GPU 0.

    python hf_finetune.py --steps 6 --out runs/hf

The model is a small Llama, random-initialised from a config built here and
saved as a checkpoint first, so nothing is downloaded.
"""
import argparse
import json
import os
import tempfile

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.utils import is_flash_attn_2_available

torch.backends.cuda.matmul.allow_tf32 = False  # ties: TNL008


def make_checkpoint(folder):
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         attention_dropout=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", default="runs/hf")
    args = parser.parse_args()

    torch.manual_seed(1)
    torch.cuda.manual_seed(1)  # ties: TNL004
    with tempfile.TemporaryDirectory() as checkpoint:
        make_checkpoint(checkpoint)
        model = AutoModelForCausalLM.from_pretrained(
            checkpoint, dtype=torch.float32, device_map={"": 0},  # ties: TNL015
            attn_implementation="flash_attention_2" if is_flash_attn_2_available() else "sdpa")  # ties: TNL019
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(1, 64, (4, 12), generator=g) for _ in range(3)]
    losses = []
    for step in range(args.steps):
        batch = {"input_ids": batches[step % len(batches)]}
        batch["labels"] = batch["input_ids"].clone()
        batch = {k: v.to("cuda") for k, v in batch.items()}  # ties: TNL003
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step % 2 == 0:
            print(f"step {step}: loss {losses[-1]:.4f}, memory {torch.cuda.memory_allocated() // 1024} KiB")  # ties: TNL004
    torch.cuda.empty_cache()  # ties: TNL004

    os.makedirs(args.out, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, os.path.join(args.out, "model.pt"))
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({"losses": losses, "device": str(next(model.parameters()).device.type)}, f)


if __name__ == "__main__":
    main()
