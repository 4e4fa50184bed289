"""Each rule of torchneuron/lockin/rules.py on the smallest code that triggers it,
its rewrite, and the name resolution behind it."""
import textwrap

import pytest

from torchneuron.lockin import RULES, analyse_text
from torchneuron.lockin.source import Source, read_notebook

from lockin_testing import analyse, fix, found

#: the accelerator's type, "cpu" without one (device rewrites); None without one (comparisons)
ACC = 'torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"'
ACC_OR_NONE = '(torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else None)'

# rule id -> (code, the line its finding is on, whether --fix rewrites it, the rewritten code or None)
CASES = {
    "TNL001": ("import torch\nm = torch.nn.Linear(2, 2).cuda()\n", 2, True,
               "import torch\nm = torch.nn.Linear(2, 2).to(" + ACC + ")\n"),
    "TNL002": ("import torch\nx = torch.ones(1)\nprint(x.is_cuda)\n", 3, True,
               "import torch\nx = torch.ones(1)\nprint(x.device.type == " + ACC_OR_NONE + ")\n"),
    "TNL003": ("import torch\nx = torch.ones(1, device='cuda:1')\n", 2, True,
               "import torch\nx = torch.ones(1, device=f'{" + ACC + "}:1')\n"),
    "TNL004": ("import torch\ntorch.cuda.synchronize(device=0)\n", 2, True,
               "import torch\ntorch.accelerator.synchronize(0)\n"),
    "TNL005": ("from torch.cuda import Event\ne = Event(enable_timing=True)\n", 1, True,
               "import torch\ne = torch.Event(enable_timing=True)\n"),
    "TNL006": ("import torch\nwith torch.cuda.amp.autocast(True):\n    pass\n", 2, True,
               "import torch\nwith torch.autocast(device_type=" + ACC + ", "
               "dtype=torch.float16, enabled=torch.accelerator.is_available() and True):\n    pass\n"),
    "TNL007": ("import torch\ntorch.backends.cudnn.benchmark = True\n", 2, False, None),
    "TNL008": ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = False  # exact\n", 2, True,
               "import torch\ntorch.set_float32_matmul_precision(\"highest\")  # exact\n"),
    "TNL009": ("import torch\ng = torch.cuda.CUDAGraph()\n", 2, False, None),
    "TNL010": ("import torch.distributed as dist\ndist.init_process_group(backend='nccl', timeout=None)\n", 2, True,
               "import torch.distributed as dist\ndist.init_process_group(timeout=None)\n"),
    "TNL011": ("import os\nos.environ['NCCL_P2P_DISABLE'] = '1'\n", 2, False, None),
    "TNL012": ("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0,1'\n", 2, False, None),
    "TNL013": ("import os\nos.environ['PYTORCH_CUDA_ALLOC_CONF'] = 'expandable_segments:True'\n", 2, False, None),
    "TNL014": ("from torch.utils.data import DataLoader\nDataLoader([], pin_memory=True, pin_memory_device='cuda')\n",
               2, True, "from torch.utils.data import DataLoader\nDataLoader([], pin_memory=True)\n"),
    "TNL015": ("import torch\nm = load('x', device_map={'': 0})\n", 2, True,
               "import torch\nm = load('x', device_map={'': torch.device(" + ACC + ", 0)})\n"),
    "TNL016": ("import torch\nf = torch.compile(lambda x: x, mode='max-autotune')\n", 2, True,
               "import torch\nf = torch.compile(lambda x: x, mode='max-autotune-no-cudagraphs')\n"),
    "TNL017": ("import torch.utils.cpp_extension\next = torch.utils.cpp_extension.CUDAExtension('k', ['k.cu'])\n", 2,
               False, None),
    "TNL018": ("import xformers.ops\n", 1, False, None),
    "TNL019": ("m = load('x', attn_implementation='flash_attention_2')\n", 1, True,
               "m = load('x', attn_implementation='sdpa')\n"),
    "TNL020": ("import torch\nprint(torch.version.cuda)\n", 2, False, None),
    "TNL021": ("import torch\nx = torch.ones(1).type(torch.cuda.FloatTensor)\n", 2, False, None),
    "TNL022": ("import subprocess\nsubprocess.run(['nvidia-smi', '-L'])\n", 2, False, None),
    "TNL023": ("from torch.profiler import ProfilerActivity, profile\n"
               "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):\n    pass\n", 2, False, None),
    "TNL024": ("import torch\nstate = torch.load('ck.pt', weights_only=True)\n", 2, False, None),
    "TNL025": ("import torch.distributed as dist\ndist.barrier(device_ids=[rank])\n", 2, True,
               "import torch.distributed as dist\ndist.barrier()\n"),
    "TNL026": ("import torch.nn as nn\nmodel = nn.DataParallel(model)\n", 2, False, None),
    "TNL027": ("import torch\ny = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb)\n", 2, False, None),
    "TNL028": ("import triton\n@triton.jit\ndef kernel(x_ptr):\n    pass\n", 2, False, None),
}


def test_every_rule_has_a_case_and_says_what_it_ties():
    assert sorted(CASES) == sorted(RULES)
    for r in RULES.values():
        assert r.ties and r.vendor and r.rewrite and r.guard, r.id


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule(rule):
    code, line, fixable, rewritten = CASES[rule]
    result = analyse_text(code)
    mine = [f for f in result.findings if f.rule == rule]
    assert [(f.line, f.fixable) for f in mine] == [(line, fixable)], result.findings
    f = mine[0]
    assert f.message and f.rewrite and f.guard and f.vendor == "NVIDIA"
    if rewritten is not None:
        assert fix(code) == rewritten
        again = analyse_text(rewritten).findings
        assert [x for x in again if x.fixable] == []


def test_cuda_method_forms():
    code = """
    import torch
    a = x.cuda(0)
    b = x.cuda(device=rank, non_blocking=True)
    c = x.cuda(*devices)
    """
    assert found(code) == [(3, "TNL001", True), (4, "TNL001", True), (5, "TNL001", False)]
    out = fix(code)
    # since PyTorch 2.5 an index is one of the current accelerator's devices
    assert "a = x.to(0)" in out
    assert "b = x.to(device=rank, non_blocking=True)" in out


def test_device_strings_in_their_contexts():
    code = """
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = x.device.type == "cuda"
    name = f"cuda:{rank}"
    base = "cuda:" + str(rank)
    kind: Literal["cuda", "cpu"] = "cpu"
    """
    assert found(code) == [(3, "TNL003", True), (3, "TNL004", True), (4, "TNL003", True), (5, "TNL003", True),
                           (6, "TNL003", True), (7, "TNL003", False)]
    out = fix(code)
    # under the availability test the accelerator is there: no fallback of its own
    assert 'device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"' \
        in out
    assert f'on_gpu = x.device.type == {ACC_OR_NONE}' in out   # False for a CPU tensor without an accelerator
    inner = ACC.replace('"', "'")
    assert 'name = f"{' + inner + '}:{rank}"' in out
    assert 'base = f"{' + inner + '}:" + str(rank)' in out


def test_amp_names_imported_and_called():
    code = """
    from torch.cuda.amp import autocast, GradScaler
    scaler = GradScaler(2.0 ** 10)
    with autocast(dtype=torch.bfloat16):
        pass
    """
    out = fix(code)
    assert "from torch.cuda" not in out and out.lstrip().startswith("import torch\n")
    assert f"scaler = torch.amp.GradScaler({ACC}, 2.0 ** 10, enabled=torch.accelerator.is_available())" in out
    assert f"with torch.autocast(device_type={ACC}, dtype=torch.bfloat16, " \
        "enabled=torch.accelerator.is_available()):" in out
    assert analyse_text(out).findings == []


def test_grad_scaler_without_a_device_defaults_to_cuda():
    assert found("import torch\ns = torch.amp.GradScaler()\n") == [(2, "TNL006", True)]
    assert found("import torch\ns = torch.amp.GradScaler('neuron')\n") == []


def test_custom_fwd_decorators():
    code = """
    import torch
    class F(torch.autograd.Function):
        @staticmethod
        @torch.cuda.amp.custom_fwd
        def forward(ctx, x):
            return x
        @staticmethod
        @torch.cuda.amp.custom_bwd
        def backward(ctx, g):
            return g
    """
    out = fix(code)
    assert f"@torch.amp.custom_fwd(device_type={ACC})" in out
    assert f"@torch.amp.custom_bwd(device_type={ACC})" in out


def test_positional_only_targets():
    # torch.accelerator's functions take their argument by position
    assert fix("import torch\nn = torch.cuda.memory_allocated(device=1)\n") == \
        "import torch\nn = torch.accelerator.memory_allocated(1) if torch.accelerator.is_available() else 0\n"
    # torch.Event takes its options by keyword only: a positional one is left for a person
    assert found("import torch\ne = torch.cuda.Event(True)\n") == [(2, "TNL004", False)]


def test_cuda_only_names_point_to_their_neutral_tool():
    result = analyse_text("import torch\ntorch.cuda.nvtx.range_push('step')\n")
    (f,) = result.findings
    assert (f.rule, f.fixable) == ("TNL004", False) and "record_function" in f.rewrite


# -- name resolution ------------------------------------------------------------------------------

def test_module_aliases():
    code = """
    import torch
    import torch.cuda as tc
    from torch import cuda
    from torch.cuda import synchronize as sync
    import torch as T

    tc.synchronize()
    cuda.manual_seed(0)
    sync()
    T.cuda.empty_cache()
    c = torch.cuda
    c.current_device()
    """
    assert [(line, rule) for line, rule, _ in found(code)] == [
        (3, "TNL005"), (4, "TNL005"), (5, "TNL005"), (8, "TNL004"), (9, "TNL004"), (10, "TNL004"), (11, "TNL004"),
        (12, "TNL004"), (13, "TNL004")]
    out = fix(code)
    # rewrites name torch by the module's first name for it
    assert "torch.accelerator.synchronize()\n" \
           "if torch.accelerator.is_available():\n    torch.get_device_module().manual_seed(0)\n" \
           "torch.accelerator.synchronize()\n" \
           "if torch.accelerator.is_available():\n    torch.accelerator.empty_cache()\n" in out
    assert "import torch.cuda" not in out and "from torch" not in out


def test_values_followed_within_a_function():
    code = """
    import torch
    def f(x):
        dev = "cuda"
        return x.to(dev)
    def g(model_id):
        placement = {"": 0}
        mode = "max-autotune"
        m = load(model_id, device_map=placement)
        return torch.compile(m, mode=mode)
    """
    assert found(code) == [(4, "TNL003", True), (7, "TNL015", True), (8, "TNL016", True)]
    out = fix(code)
    assert 'placement = {"": torch.device(' + ACC + ', 0)}' in out
    assert 'mode = "max-autotune-no-cudagraphs"' in out


def test_shadowing_and_lookalikes_are_not_torch():
    code = """
    import torch
    def f(torch):
        torch.cuda.synchronize()
    cuda = False
    if args.cuda and cuda:
        print("cuda is a word here", options.is_cuda_build)
    def g():
        import numba.cuda  # a CUDA-only package, counted as such
    """
    assert found(code) == [(9, "TNL018", False)]


def test_class_scope_is_not_seen_from_methods():
    code = """
    import torch
    class A:
        torch = None
        def f(self):
            torch.cuda.synchronize()
    """
    assert found(code) == [(6, "TNL004", True)]


# -- guards ---------------------------------------------------------------------------------------

def test_capability_guards_are_not_counted():
    code = """
    import torch
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.benchmark = True
    if torch.accelerator.current_accelerator().type == "cuda":
        torch.cuda.nvtx.range_push("x")
    try:
        import flash_attn
    except ImportError:
        flash_attn = None
    if is_apex_available():
        import apex
    """
    result = analyse(code)
    assert [(f.line, f.guarded) for f in result.findings] == [(4, True), (6, True), (8, True), (12, True)]
    assert found(code) == []


def test_a_cuda_test_guarding_cuda_only_code_is_left_to_a_person():
    code = """
    import torch
    if torch.cuda.is_available():
        torch.cuda.nvtx.range_push("x")
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(0)
    """
    assert found(code) == [(3, "TNL004", False), (4, "TNL004", False), (5, "TNL004", True), (6, "TNL004", True)]


def test_process_group_backend_choices():
    code = """
    import torch.distributed as dist
    dist.init_process_group("nccl")
    dist.init_process_group(backend="nccl" if use_gpu else "gloo", world_size=2)
    backend = "nccl"
    """
    assert found(code) == [(3, "TNL010", True), (4, "TNL010", True), (5, "TNL010", False)]
    out = fix(code)
    assert "dist.init_process_group()\ndist.init_process_group(world_size=2)\n" in out


def test_compile_modes_only_under_inductor():
    assert found("import torch\ntorch.compile(m, backend='neuron', mode='reduce-overhead')\n") == []
    assert found("import torch\ntorch.compile(m, mode='reduce-overhead')\n") == [(2, "TNL016", False)]
    assert found("import torch\ntorch.compile(m, backend='cudagraphs')\n") == [(2, "TNL016", False)]


# -- files ----------------------------------------------------------------------------------------

def test_notebook_cells_and_lines(tmp_path):
    import json
    path = tmp_path / "n.ipynb"
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# title"]},
             {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
              "source": ["import torch\n", "%time x = 1\n", "y = torch.ones(1).cuda()"]},
             {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
              "source": "%%bash\necho cuda"},
             {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
              "source": "torch.cuda.synchronize()\n!nvidia-smi"}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    from torchneuron.lockin import analyse_file
    result = analyse_file(str(path))
    assert [(f.cell, f.line, f.rule) for f in result.findings] == [(2, 3, "TNL001"), (4, 1, "TNL004"),
                                                                   (4, 2, "TNL022")]
    assert result.skipped_cells == [3]


def test_a_cell_that_does_not_parse_is_skipped(tmp_path):
    import json
    path = tmp_path / "n.ipynb"
    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "source": "def broken(:\n    pass"},
             {"cell_type": "code", "metadata": {}, "outputs": [], "source": "import torch\ntorch.cuda.init()"}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    source = read_notebook(str(path))
    from torchneuron.lockin import analyse_source
    result = analyse_source(source)
    assert [(f.cell, f.line) for f in result.findings] == [(2, 2)] and result.skipped_cells == [1]


def test_a_syntax_error_is_reported_not_raised():
    result = analyse_text("import torch\nx = torch.cuda.(\n")
    assert result.error and "line 2" in result.error and result.findings == []


def test_a_file_without_trigger_words_is_not_parsed():
    result = analyse_text("import torch\nx = torch.ones(3)\n")
    assert not result.parsed and result.findings == []


def test_fix_keeps_formatting_and_comments():
    code = textwrap.dedent("""
    import torch   # the only import


    def step(batch):  # one step
        inputs = batch[ 'x' ].cuda( non_blocking = True )   # spacing kept
        return inputs
    """)
    assert fix(code) == code.replace(".cuda( non_blocking = True )",
                                     ".to( " + ACC + ", non_blocking = True )")


def test_source_of_a_py_file_maps_lines_to_themselves():
    assert Source("a.py", "x\n").location(7) == (None, 7)


# -- misses and false positives ---------------------------------------------------------------------

def test_an_import_whose_handler_re_raises_or_exits_is_not_guarded():
    code = """
    try:
        import flash_attn
    except ImportError:
        raise ImportError("pip install flash-attn")
    try:
        import apex
    except ImportError:
        sys.exit("apex is needed")
    try:
        import xformers
    except ImportError:
        xformers = None
    """
    assert [(f.line, f.guarded) for f in analyse(code).findings] == [(3, False), (7, False), (11, True)]


def test_cudnn_imported_is_not_a_tie_its_settings_are():
    code = """
    import torch
    import torch.backends.cudnn as cudnn
    from torch.backends import cudnn as cd
    import torch.backends.cuda as tbc
    cudnn.benchmark = True
    cd.deterministic = True
    tbc.matmul.allow_tf32 = True
    """
    assert found(code) == [(6, "TNL007", False), (7, "TNL007", False), (8, "TNL008", True)]


def test_a_backend_name_compared_only_to_say_which_runs_is_not_a_tie():
    code = """
    import torch.distributed as dist
    if dist.get_backend() == "nccl":
        print("using NCCL")
    else:
        logger.info("using %s", dist.get_backend())
    if args.device == "cuda":
        print("on the GPU")
    if dist.get_backend() == "nccl":
        dist.all_reduce(t)
    """
    assert found(code) == [(9, "TNL010", False)]


def test_a_rewrite_under_an_availability_test_gets_no_second_guard():
    code = """
    import torch
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(0)
        x = x.cuda()
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    device = torch.device("cuda:0" if use_cuda else "cpu")
    if x.is_cuda:
        print(torch.cuda.memory_allocated())
    scaler = torch.cuda.amp.GradScaler() if torch.cuda.device_count() > 0 else None
    torch.cuda.empty_cache()
    """
    out = fix(code)
    assert "if torch.accelerator.is_available():\n    torch.get_device_module().manual_seed_all(0)\n" \
           "    x = x.to(torch.accelerator.current_accelerator().type)\n" in out
    assert 'device = torch.device(f"{torch.accelerator.current_accelerator().type}:0" if use_cuda else "cpu")' in out
    assert "    print(torch.accelerator.memory_allocated())\n" in out
    assert "scaler = torch.amp.GradScaler(torch.accelerator.current_accelerator().type) " \
           "if torch.accelerator.device_count() > 0 else None" in out
    # outside any test the fallback stays
    assert out.endswith("if torch.accelerator.is_available():\n    torch.accelerator.empty_cache()\n")


def test_data_parallel_on_the_default_path_only():
    code = """
    import torch
    import torch.nn as nn
    model = nn.DataParallel(model)
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    if args.n_gpu > 1:
        model = torch.nn.DataParallel(model)
    model = nn.DataParallel(model) if n_gpu > 1 else model
    out = nn.parallel.data_parallel(module, x, range(ngpu))
    """
    assert [(line, rule) for line, rule, _ in found(code)] == [(4, "TNL026"), (5, "TNL004"), (10, "TNL026")]


def test_profiler_cuda_activity_and_use_cuda():
    code = """
    import torch
    from torch.profiler import ProfilerActivity as PA
    with torch.profiler.profile(activities=[PA.CPU, PA.CUDA]) as prof:
        pass
    with torch.autograd.profiler.profile(use_cuda=True):
        pass
    print(prof.key_averages().table(sort_by="cuda_time_total"))
    """
    assert [(line, rule) for line, rule, _ in found(code)] == [(4, "TNL023"), (6, "TNL023")]


def test_torch_load_without_map_location():
    code = """
    import torch
    from torch import load
    a = torch.load(path)
    b = torch.load(path, "cpu")
    c = torch.load(path, map_location=device, weights_only=True)
    d = load(path, weights_only=True)
    e = torch.load(path, **kwargs)
    """
    result = analyse(code)
    assert [(f.line, f.rule, f.implicit) for f in result.findings] == [(4, "TNL024", True), (7, "TNL024", True)]


def test_fp8_and_triton_kernels_are_implicit_ties():
    code = """
    import torch
    import triton
    import triton.language as tl
    from triton import autotune

    @autotune(configs=[], key=["n"])
    @triton.jit
    def kernel(x_ptr, n, BLOCK: tl.constexpr):
        pass

    y = torch._scaled_mm(a.to(torch.float8_e4m3fn), b, scale_a=s, scale_b=s)
    """
    result = analyse(code)
    assert [(f.line, f.rule, f.implicit) for f in result.findings] == [
        (3, "TNL018", True), (4, "TNL018", True), (5, "TNL018", True), (7, "TNL028", True), (8, "TNL028", True),
        (12, "TNL027", True)]


# -- notebooks: --fix rewrites cells, the rest of the file byte for byte --------------------------

def _colab(cells: list[tuple[str, str]]) -> str:
    """A notebook as Colab saves it: two-space indent, nbformat first, a cell's source
    before its metadata, non-ASCII as it is, no final newline."""
    import json
    nb = {"nbformat": 4, "nbformat_minor": 0,
          "metadata": {"colab": {"provenance": []}, "kernelspec": {"name": "python3", "display_name": "Python 3"},
                       "language_info": {"name": "python"}, "accelerator": "GPU"},
          "cells": [{"cell_type": kind, "source": text.splitlines(keepends=True), "metadata": {"id": f"c{i}"},
                     **({"execution_count": None, "outputs": []} if kind == "code" else {})}
                    for i, (kind, text) in enumerate(cells)]}
    return json.dumps(nb, indent=2, ensure_ascii=False)


def _fixed_diff(tmp_path, text: str, name: str = "n.ipynb") -> tuple[str, list[str]]:
    import difflib
    from torchneuron.lockin.fixer import fix_path
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    fix_path(str(path), write=True)
    after = path.read_text(encoding="utf-8")
    changed = [ln for ln in difflib.unified_diff(text.split("\n"), after.split("\n"), lineterm="", n=0)
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return after, changed


def test_a_colab_notebook_with_one_cuda_line_gets_a_one_line_diff(tmp_path):
    text = _colab([("markdown", "# Données → GPU"), ("code", "!nvidia-smi\nimport torch\n"),
                   ("code", "x = torch.ones(2)\ny = x.cuda()\nprint(y)")])
    after, changed = _fixed_diff(tmp_path, text)
    assert changed == ['-        "y = x.cuda()\\n",',
                       f'+        "y = x.to({ACC.replace(chr(34), chr(92) + chr(34))})\\n",']
    assert not after.endswith("\n") and "Données → GPU" in after


def test_a_notebook_fix_that_adds_lines_keeps_the_list_layout(tmp_path):
    import json
    # Jupyter's own layout: one-space indent, sorted keys, a final newline; a string source too
    nb = {"cells": [{"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [],
                     "source": ["import torch\n", "torch.cuda.manual_seed(0)\n", "print('é')"]},
                    {"cell_type": "code", "execution_count": 2, "metadata": {}, "outputs": [],
                     "source": "torch.cuda.empty_cache()\n"}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    text = json.dumps(nb, indent=1, sort_keys=True) + "\n"   # non-ASCII escaped, as this writer chose
    after, changed = _fixed_diff(tmp_path, text)
    assert changed == ['-    "torch.cuda.manual_seed(0)\\n",',
                       '+    "if torch.accelerator.is_available():\\n",',
                       '+    "    torch.get_device_module().manual_seed(0)\\n",',
                       '-   "source": "torch.cuda.empty_cache()\\n"',
                       '+   "source": "if torch.accelerator.is_available():\\n    torch.accelerator.empty_cache()\\n"']
    assert after.endswith("}\n") and json.loads(after)["cells"][0]["source"][-1] == "print('é')"


def test_the_corpus_colab_notebook_changes_only_its_tying_lines(tmp_path):
    import os
    from lockin_testing import PATTERNS
    path = os.path.join(PATTERNS, "colab_classifier.ipynb")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    after, changed = _fixed_diff(tmp_path, text)
    removed = [ln for ln in changed if ln.startswith("-")]
    # the rewritten lines are the fixable tying lines, each once, and nothing else of the file
    assert len(removed) == 3 and all("# ties" in ln for ln in removed), changed
    assert len(after.split("\n")) == len(text.split("\n"))
