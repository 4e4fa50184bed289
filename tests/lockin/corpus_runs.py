"""Runs the labelled corpus programs, in this one process, three ways each
(the tests compare the results; keeping them in one process pays PyTorch's
and transformers' import once):

* ``reference``: the original program with CUDA mapped to the CPU
  (redirect.py, target ``cpu``), as on a machine without CUDA;
* ``fixed``: the program after ``--fix``, as it is, on ``neuron``;
* ``run``: the original program under ``torchneuron-lockin run`` on ``neuron``.

    python corpus_runs.py OUT_DIR FIXED_DIR [--cli SCRIPT REPORT] PROGRAM...

Each run writes OUT_DIR/<program>/<way>/ (the program's result.json and
model.pt); OUT_DIR/runs.json says how each ended, with the run mode's sites.
``--cli`` also runs ``torchneuron-lockin run --format json -o REPORT SCRIPT``
through the command line's own entry point.
The DDP launcher's reference run is a process group of one (gloo, RANK=0):
the other two run its single-process branch, since distributed training has
no neuron backend yet, and a group of one averages nothing, so the results
must agree.
"""
import json
import os
import socket
import sys

import torch

from torchneuron.lockin.running import run_program

# global settings a program may change, put back before each run
_FLAGS = {"precision": torch.get_float32_matmul_precision(), "benchmark": torch.backends.cudnn.benchmark,
          "deterministic": torch.backends.cudnn.deterministic, "cudnn_tf32": torch.backends.cudnn.allow_tf32}


def _reset():
    torch.set_float32_matmul_precision(_FLAGS["precision"])
    torch.backends.cudnn.benchmark = _FLAGS["benchmark"]
    torch.backends.cudnn.deterministic = _FLAGS["deterministic"]
    torch.backends.cudnn.allow_tf32 = _FLAGS["cudnn_tf32"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(program: str, out: str, target, distributed: bool) -> dict:
    os.makedirs(out, exist_ok=True)
    env = {"CORPUS_OUT": out}
    if distributed:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _reset()
    try:
        args = [] if program.endswith(".ipynb") else ["--out", out]
        code, sites = run_program(program, args, target, [program])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"exit": code, "sites": sites}


def main(out_dir: str, fixed_dir: str, programs: list[str], cli: tuple[str, str] | None) -> None:
    ended = {"libcst_imported_by_runs": None}
    for program in programs:
        name = os.path.basename(program)
        ddp = name.startswith("ddp")
        ended[name] = {
            "reference": run(program, os.path.join(out_dir, name, "reference"), "cpu", distributed=ddp),
            "fixed": run(os.path.join(fixed_dir, name), os.path.join(out_dir, name, "fixed"), None, False),
            "run": run(program, os.path.join(out_dir, name, "run"), "neuron", False),
        }
    ended["libcst_imported_by_runs"] = "libcst" in sys.modules   # analysis and run mode need no LibCST
    if cli is not None:
        from torchneuron.lockin.__main__ import main as lockin_main
        ended["cli_exit"] = lockin_main(["run", "--format", "json", "-o", cli[1], cli[0]])
    with open(os.path.join(out_dir, "runs.json"), "w") as f:
        json.dump(ended, f, indent=1)


if __name__ == "__main__":
    argv = sys.argv[1:]
    cli_run = None
    if "--cli" in argv:
        i = argv.index("--cli")
        cli_run = (argv[i + 1], argv[i + 2])
        del argv[i:i + 3]
    main(argv[0], argv[1], argv[2:], cli_run)
