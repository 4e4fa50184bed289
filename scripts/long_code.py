"""Product files over 600 lines and functions over 80, Python and C++ (the house rule's limits).

    .venv/bin/python scripts/long_code.py [--list] [ROOT]

Product code is csrc/ (not its C++ unit tests), torchneuron/ and torch_neuronx/.
A Python function is a def (methods and nested defs too); a C++ function is a
body whose header has a parameter list and is not a control statement, class or
namespace, measured from its header's last line to its closing brace (lambdas
count within the function that holds them).
"""
import ast
import os
import re
import sys

FILE_LIMIT, FUNCTION_LIMIT = 600, 80
PRODUCT = ("csrc", "torchneuron", "torch_neuronx")
NOT_PRODUCT = {"tests", "__pycache__"}
NOT_A_FUNCTION = re.compile(r"^\s*(if|for|while|switch|catch|do|else|try)\b|\b(namespace|class|struct|enum|union)\b"
                            r"|=\s*$|\[[^\]]*\]\s*(\([^)]*\))?\s*(mutable\s*)?(->[^{]*)?$")


def product_files(root):
    for top in PRODUCT:
        for directory, subdirs, files in os.walk(os.path.join(root, top)):
            subdirs[:] = sorted(d for d in subdirs if d not in NOT_PRODUCT)
            for f in sorted(files):
                if f.endswith((".py", ".cpp", ".h")):
                    yield os.path.join(directory, f)


def python_functions(text):
    """(name, first line, lines) of every def."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def _code_only(text):
    """The text with comments, string and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def cpp_functions(text):
    """(header, first line, lines) of every function body outside another function."""
    code = _code_only(text)
    depth, line, start, header_from = 0, 1, None, 0
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            if start is None:
                header = code[header_from:i].strip()
                if ")" in header and not NOT_A_FUNCTION.search(header.splitlines()[-1] if header else ""):
                    name = re.search(r"([\w:~]+)\s*\(", header)
                    start = (depth, line, name.group(1) if name else " ".join(header.split())[-60:])
            depth += 1
            if start is None:
                header_from = i + 1
        elif c == "}":
            depth -= 1
            if start is not None and depth == start[0]:
                yield start[2], start[1], line - start[1] + 1
                start = None
            if start is None:
                header_from = i + 1
        elif c == ";" and start is None:
            header_from = i + 1
        elif c == "#" and start is None:  # a preprocessor line is not part of a header
            header_from = code.find("\n", i) + 1 or len(code)


def report(root):
    long_files, long_functions = [], []
    for path in product_files(root):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        rel = os.path.relpath(path, root)
        if text.count("\n") > FILE_LIMIT:
            long_files.append((rel, text.count("\n")))
        functions = python_functions(text) if path.endswith(".py") else cpp_functions(text)
        long_functions += [(rel, name, first, n) for name, first, n in functions if n > FUNCTION_LIMIT]
    return long_files, long_functions


def main(argv):
    listing = "--list" in argv
    args = [a for a in argv if a != "--list"]
    root = args[0] if args else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    long_files, long_functions = report(root)
    for lang, suffixes in (("Python", (".py",)), ("C++", (".cpp", ".h"))):
        files = [f for f in long_files if f[0].endswith(suffixes)]
        functions = [f for f in long_functions if f[0].endswith(suffixes)]
        print(f"{lang}: {len(files)} files over {FILE_LIMIT} lines, {len(functions)} functions over {FUNCTION_LIMIT}")
        if listing:
            for rel, n in sorted(files, key=lambda f: -f[1]):
                print(f"  {n:5d} lines  {rel}")
            for rel, name, first, n in sorted(functions, key=lambda f: -f[3]):
                print(f"  {n:5d} lines  {rel}:{first}  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
