"""torchneuron-lockin: how many lines tie a PyTorch program to CUDA, and the rewrite that unties them.

    torchneuron-lockin PATH...             # the report: files, folders, notebooks
    torchneuron-lockin --fix PATH...       # rewrite what can be rewritten, in place
    torchneuron-lockin --diff PATH...      # show that rewrite as a unified diff
    torchneuron-lockin run script.py ARGS  # run a CUDA program on neuron, recording what it needed

The analysis (detect.py) and the reports import only the standard library;
LibCST is imported by the fixer alone, and the run-time redirection of
``torch.cuda`` exists only in redirect.py, entered only by ``run``.
"""
from .detect import FileResult, Finding, analyse_file, analyse_source, analyse_text
from .rules import RULES, Rule

__all__ = ["FileResult", "Finding", "RULES", "Rule", "analyse_file", "analyse_source", "analyse_text"]
