#!/usr/bin/env python
"""Fine-tune a small transformers model with ``Trainer``: on ``neuron``, with no line about devices.

    python examples/hf_finetune.py                  # 240 steps
    python examples/hf_finetune.py --max-steps 20   # a quick look

Nothing here names a device. With torchneuron installed, ``import torch``
registers ``neuron`` and transformers finds it under AWS's import name
``torch_neuronx``, so ``TrainingArguments`` picks ``neuron:0`` and ``Trainer``
moves the model there (docs/huggingface.md). The model is a small Llama,
random-initialised from a config built here; the text is generated from a few
sentence templates and split into words by a tokenizer built here too, so
nothing is downloaded. ``Trainer`` shows its tqdm progress bar; the training
and evaluation losses are plotted to ``<out>/hf_finetune_loss.png``.
"""
from __future__ import annotations

import argparse
import os
import random

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Trainer, TrainingArguments,
                          set_seed)

ADJECTIVES = "big small red blue old young quick lazy".split()
NOUNS = "cat dog bird fox mouse horse".split()
VERBS = "sees chases follows watches".split()
PLACES = "garden house field river".split()


def sentence(rng: random.Random) -> str:
    """One sentence of a tiny grammar: what the model learns is its structure."""
    return (f"the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)} "
            f"near the {rng.choice(PLACES)} .")


def word_tokenizer() -> PreTrainedTokenizerFast:
    words = sorted(set(ADJECTIVES + NOUNS + VERBS + PLACES + ["the", "near", "."]))
    vocab = {"[PAD]": 0, "[UNK]": 1, "[BOS]": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]")


def examples(tokenizer, count: int, seed: int, sentences_per_example: int = 4) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        text = " ".join(sentence(rng) for _ in range(sentences_per_example))
        ids = [tokenizer.bos_token_id] + tokenizer(text)["input_ids"]
        rows.append({"input_ids": torch.tensor(ids), "labels": torch.tensor(ids)})
    return rows


def plot_losses(log_history: list[dict], device: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(e["step"], e["loss"]) for e in log_history if "loss" in e]
    evaluation = [(e["step"], e["eval_loss"]) for e in log_history if "eval_loss" in e]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*zip(*train), label="training loss")
    if evaluation:
        ax.plot(*zip(*evaluation), "o-", label="evaluation loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy")
    ax.set_title(f"Trainer fine-tuning a small Llama on {device}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--max-steps", type=int, default=240, help="optimizer steps")
    parser.add_argument("--out", default="artifacts", help="folder for the plot and the checkpoints")
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                        help="bfloat16 autocast (the Trainer's bf16=True)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    set_seed(args.seed)
    tokenizer = word_tokenizer()
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=None))
    training = TrainingArguments(
        output_dir=os.path.join(args.out, "hf_finetune"), max_steps=args.max_steps, learning_rate=3e-3,
        warmup_steps=max(1, args.max_steps // 10), lr_scheduler_type="cosine", per_device_train_batch_size=8,
        gradient_accumulation_steps=2, per_device_eval_batch_size=16, bf16=args.bf16,
        logging_steps=max(1, args.max_steps // 40), eval_strategy="steps", eval_steps=max(1, args.max_steps // 6),
        save_strategy="no", report_to=[], seed=args.seed)
    trainer = Trainer(model=model, args=training, train_dataset=examples(tokenizer, 512, seed=1),
                      eval_dataset=examples(tokenizer, 64, seed=2))
    print(f"Trainer device: {training.device}; model parameters: {sum(p.numel() for p in model.parameters()):,}")
    trainer.train()
    metrics = trainer.evaluate()

    plot = os.path.join(args.out, "hf_finetune_loss.png")
    plot_losses(trainer.state.log_history, str(training.device), plot)
    prompt = tokenizer("[BOS] the big cat", return_tensors="pt", add_special_tokens=False)
    generated = model.generate(**prompt.to(model.device), max_new_tokens=12, do_sample=False)
    uniform = torch.log(torch.tensor(float(len(tokenizer)))).item()
    print(f"evaluation loss {metrics['eval_loss']:.3f} (a uniform guess over the vocabulary: {uniform:.3f})")
    print("greedy continuation:", tokenizer.decode(generated[0], skip_special_tokens=True))
    print(f"loss plot: {plot}")
    return {"device": str(training.device), "eval_loss": metrics["eval_loss"], "plot": plot}


if __name__ == "__main__":
    main()
