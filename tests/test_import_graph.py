"""torchneuron's imports run one way. Every module of torchneuron/ is parsed
(imports at module level and inside functions, relative and absolute); the
test fails on an import circle, on a module with no declared layer, and on an
import from a lower layer into a higher one. The layers, lowest first, are
declared in LAYERS below (and described in README.md's "Import layers")."""
import ast
import os

from neuron_testing import ROOT

PACKAGE = "torchneuron"
EXTENSIONS = ("torchneuron._C",)  # compiled modules: imported, never importing

# Lowest first. A module belongs to the longest entry that names it or a package
# above it (the root package names only its own __init__.py). A module may import
# its own layer or lower ones; circles are refused inside a layer too.
LAYERS = (
    ("runtime bindings", ("torchneuron._C", "torchneuron._python_tasks", "torchneuron.environment")),
    ("torch.neuron, the device module", ("torchneuron.neuron",)),
    ("neuron tensors through torch.multiprocessing and nn.DataParallel", ("torchneuron.sharing",
                                                                          "torchneuron.parallel_comm")),
    ("patch ledger and device registration", ("torchneuron._torch_patches", "torchneuron._registration")),
    # the NKI emulator, from its values up to its tools
    ("NKI: errors, dtypes, registers", ("torchneuron.nki.errors", "torchneuron.nki.dtypes", "torchneuron.nki.lnc",
                                        "torchneuron.nki.registers", "torchneuron.nki.typing",
                                        "torchneuron.nki.host_dtypes")),
    ("NKI: the machine model", ("torchneuron.nki.machine",)),
    ("NKI: an instance's state and liveness", ("torchneuron.nki.liveness", "torchneuron.nki.context")),
    ("NKI: the instruction hook", ("torchneuron.nki.instruction",)),
    ("NKI: tiles", ("torchneuron.nki.tensor",)),
    ("NKI: tile arithmetic", ("torchneuron.nki.ops",)),
    ("NKI: the kernel language", ("torchneuron.nki.language", "torchneuron.nki.isa", "torchneuron.nki.isa_constants",
                                  "torchneuron.nki.compiler", "torchneuron.nki.collectives")),
    ("NKI: traces", ("torchneuron.nki.trace", "torchneuron.nki.recorder")),
    ("NKI: the lowering's machinery", ("torchneuron.nki.lower.lowerer", "torchneuron.nki.lower.program")),
    ("NKI: lowerings by instruction family", tuple(f"torchneuron.nki.lower.{family}" for family in (
        "allocation", "movement", "arithmetic", "matmul", "engines"))),
    ("NKI: lowering a trace and its replay", ("torchneuron.nki.lower",)),
    ("NKI: launching kernels", ("torchneuron.nki.jit",)),
    ("NKI: kernels on torch tensors", ("torchneuron.nki.torch_bridge",)),
    ("NKI: the performance model", ("torchneuron.nki.perf_costs", "torchneuron.nki.perf_report",
                                    "torchneuron.nki.perf_schedule", "torchneuron.nki.perf", "torchneuron.nki.bench")),
    ("NKI: front ends", ("torchneuron.nki.compiled_calls", "torchneuron.nki.frontend", "torchneuron.nki.import_names")),
    ("NKI: the package", ("torchneuron.nki",)),
    ("NKI: tools", ("torchneuron.nki.cpu_simulator", "torchneuron.nki.library", "torchneuron.nki.library_stand_ins",
                    "torchneuron.nki.conformance")),
    ("the Trainium twin", ("torchneuron.target",)),
    ("subsystems", ("torchneuron.compile", "torchneuron.distributed", "torchneuron.varlen")),
    ("integrations", ("torchneuron.huggingface", "torchneuron.lightning")),
    ("tools", ("torchneuron.sanitizers", "torchneuron.explorer", "torchneuron.lockin")),
    ("the sanitizers' documented names", ("torchneuron.sanitizer", "torchneuron.memcheck")),
    ("the package: import torchneuron", ("torchneuron",)),
)


def _modules():
    """{module name: path} of every Python module under torchneuron/, plus the extensions."""
    modules = dict.fromkeys(EXTENSIONS)
    for directory, subdirs, files in os.walk(os.path.join(ROOT, PACKAGE)):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(directory, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                modules[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return modules


def _targets(node, module, is_package, modules):
    """The torchneuron modules an import statement loads (a package's ``from . import x``
    names the submodule x when there is one)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")[:len(module.split(".")) + is_package - node.level]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module
        names = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
    found = []
    for name in names:
        while name and name not in modules:  # a name inside a module: the module
            name = name.rpartition(".")[0]
        if name:
            found.append(name)
    return found


def _graph():
    """({importer: {imported}}, [(importer, line, statement) of imports inside functions])."""
    modules = _modules()
    edges, deferred = {m: set() for m in modules}, []
    for module, path in modules.items():
        if path is None:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_package = path.endswith("__init__.py")

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    targets = [t for t in _targets(child, module, is_package, modules) if t != module]
                    edges[module].update(targets)
                    if in_function and targets:
                        deferred.append((module, child.lineno, ast.unparse(child)))
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(tree, False)
    return edges, deferred


def _circles(edges):
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, circles, counter = {}, {}, set(), [], [], [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def _layer(module):
    """(layer index, entry) of the longest LAYERS entry covering ``module``, or None."""
    best = None
    for rank, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            covers = module == entry or (entry != PACKAGE and module.startswith(entry + "."))
            if covers and (best is None or len(entry) > len(best[1])):
                best = (rank, entry)
    return best


def test_no_import_circles():
    edges, _ = _graph()
    assert not _circles(edges), "import circles (each a set of modules importing each other):\n" + "\n".join(
        " <-> ".join(c) for c in _circles(edges))


def test_every_module_has_a_layer():
    edges, _ = _graph()
    assert len(edges) > 50, "torchneuron/ was not found"
    missing = sorted(m for m in edges if _layer(m) is None)
    assert not missing, "modules with no layer in tests/test_import_graph.py's LAYERS: " + ", ".join(missing)


def test_imports_go_down_the_layers():
    edges, _ = _graph()
    upward = []
    for importer, imported in sorted(edges.items()):
        here = _layer(importer)
        for target in sorted(imported):
            there = _layer(target)
            if here and there and there[0] > here[0]:
                upward.append(f"{importer} ({LAYERS[here[0]][0]}) imports {target} ({LAYERS[there[0]][0]})")
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def test_the_graph_sees_circles_and_deferred_imports():
    """The parser itself: a relative import inside a function is an edge, and two modules
    importing each other are a circle."""
    edges, deferred = _graph()
    assert "torchneuron.nki.machine" in edges["torchneuron.nki.tensor"]
    assert "torchneuron._C" in edges["torchneuron.neuron"]
    assert any(m == "torchneuron.compile.registration" for m, _, _ in deferred)
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
