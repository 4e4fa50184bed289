"""Runs the fuzzer from the command line.

    python -m tests.fuzz --path generic --seed 123       one program: its mismatches, minimised
    python -m tests.fuzz --path generic --programs 5000  many, in child processes (a crash or a hang
                                                         names its seed); findings minimised to --out
"""
from __future__ import annotations

import argparse
import sys

from . import generator, minimise, runner


def one(path: str, seed: int, show: bool) -> int:
    program = generator.generate(seed, path)
    found = runner.check(program)
    if show:
        print(program.source())
    if not found:
        print(f"path {path}, seed {seed}: no mismatch")
        return 0
    small, mismatches = minimise.minimise(program)
    if program.path != "compiled" and any(m.kind == "error deferred" for m in mismatches):
        mismatches = runner.locate(small) or mismatches
    print(minimise.report(small, mismatches, program))
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", choices=list(generator.PROFILES), default="generic")
    parser.add_argument("--seed", type=int, help="run this one program")
    parser.add_argument("--show", action="store_true", help="print the whole program first")
    args = parser.parse_args(argv)
    if args.seed is not None:
        return one(args.path, args.seed, args.show)
    parser.error("give --seed")
    return 2


if __name__ == "__main__":
    sys.exit(main())
