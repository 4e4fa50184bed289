"""transformers without a device name: device_map="auto" and the library's own choice."""
import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments


def load(path: str, cuda_graphs_wanted: bool = False):
    # "cuda" appears in this comment only; the model goes where accelerate puts it
    model = AutoModelForCausalLM.from_pretrained(path, device_map="auto", dtype=torch.bfloat16,
                                                 attn_implementation="sdpa")
    if cuda_graphs_wanted:
        model = torch.compile(model, backend="neuron", mode="reduce-overhead")
    return model


def train(model, dataset, output_dir: str, use_cuda_flag: bool = False):
    args = TrainingArguments(output_dir, bf16=True, per_device_train_batch_size=4, use_cpu=use_cuda_flag)
    return Trainer(model=model, args=args, train_dataset=dataset).train()


class Options:
    cuda = False          # an attribute of this program named cuda, not torch's
    cudnn_like = "none"


def describe(options: Options) -> str:
    return "CUDA-free" if not options.cuda else "asked for a cuda option"
