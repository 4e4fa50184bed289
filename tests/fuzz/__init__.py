"""Differential random-program fuzzer: the same program on the CPU and on
`neuron`, compared value for value (bit for bit), stride for stride, in its
aliasing and in its exceptions, statement by statement.

* generator.py  random programs as Python source, per path (lean, generic,
                fused, compiled), each seeded and reproducible (a seed names a
                program for this generator and known_findings.py: a statement
                left out changes what is drawn after it)
* known_findings.py  reported findings kept out of the generator, each naming
                its regression test in test_regressions.py
* runner.py     runs a program on a device and compares two runs
* minimise.py   shrinks a failing program to the statements that still fail
* test_fuzz.py  the CI test; test_regressions.py one test per finding

Long runs: ``python -m tests.fuzz --help`` (see tests/README.md).
"""
