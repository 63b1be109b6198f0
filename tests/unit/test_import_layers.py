"""The import graph of trainer/ and rlbench/: no circles, and no import that runs up the layers.

Built on `ast` over every module's source rather than on import-linter: no extra dependency, no
import of the code (no torch, no megatron), and it sees every import statement wherever it stands,
including the ones inside functions (a lazy import is still a dependency; it only moves the
failure to run time). Each module belongs to the layer with the longest matching prefix below;
a module may import its own layer and the layers under it. A new module that matches no prefix
fails the test until it is placed.

    python tests/unit/test_import_layers.py     # prints the circles and upward edges, if any
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A prefix names a package or a module; the longest match decides, except that a bare
# top-level name ("trainer", "rlbench") is that package's __init__ only, so a module at a root that no
# prefix names fails test_every_module_has_a_layer.
LAYERS: list[tuple[str, list[str]]] = [
    ("errors", ["trainer.errors"]),
    ("machine facts", ["trainer.platform", "trainer.platform.env"]),
    ("math and rewards", ["trainer.algorithms", "trainer.rewards"]),
    ("config", ["trainer.config"]),
    ("rollout interface", ["trainer.rollout.base", "trainer.rollout.decode_cache"]),
    ("agent", ["trainer.agent"]),
    ("data", ["trainer.data"]),
    ("components", ["trainer.components"]),
    # the families' configs, forwards and tokenizers (specs, moe, vlm); no weights loaded, no warm start
    ("model families", ["trainer.models"]),
    # log-probs run a model's forward (a VLM's through its family's multimodal_hidden_states)
    ("ops", ["trainer.ops"]),
    ("backends", ["trainer.backends"]),
    ("rollout engines", ["trainer.rollout"]),
    # the warm starts train and sample (ops, rollout.hf) before RL
    ("warm starts", ["trainer.models.warm_start", "trainer.models.warm_start_vlm"]),
    # the loader: any model.path, warm starts applied
    ("model loader", ["trainer.models.loading", "trainer.models.__main__"]),
    ("step", ["trainer.modes.steps"]),
    ("workers", ["trainer.distributed"]),
    ("loops", ["trainer.modes"]),
    ("preflight", ["trainer.platform.preflight"]),
    ("bench", ["trainer.bench"]),
    ("trainer entry", ["trainer", "trainer.api", "trainer.__main__"]),
    ("suites", ["rlbench.suites"]),
    ("results store", ["rlbench.store"]),
    ("ingest", ["rlbench.ingest"]),
    ("checks", ["rlbench.checks"]),
    ("report", ["rlbench.report"]),
    ("run", ["rlbench.run"]),
    ("rehearse", ["rlbench.rehearse"]),
    ("selftest", ["rlbench.selftest"]),
    # pytest suites/: collects the checks, the rehearsals and the store options of everything below
    ("pytest plugin", ["rlbench.run.pytest_plugin"]),
    ("rlbench entry", ["rlbench", "rlbench.cli", "rlbench.__main__"]),
]


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file of every module under trainer/ and rlbench/ (a package is its __init__)."""
    out = {}
    for p in sorted([*root.glob("trainer/**/*.py"), *root.glob("rlbench/**/*.py")]):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports, from every import statement (function-level ones too).

    `from a.b import c` is an edge to `a.b.c` when that is a module, else to `a.b`; relative imports
    are resolved; an import of a name outside the project is left out.
    """
    mods = modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(resolve(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.add(sub if sub in mods else resolve(base))
        graph[mod] = {t for t in targets if t and t != mod}
    return graph


def layer_of(mod: str) -> int | None:
    best, index = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or ("." in p and mod.startswith(p + "."))) and len(p) > best:
                best, index = len(p), i
    return index


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b (layer x -> layer y)` for every import of a module in a higher layer."""
    out = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la:
                out.append(f"{a} -> {b} ({LAYERS[la][0]} -> {LAYERS[lb][0]})")
    return out


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in modules() if layer_of(m) is None)
    assert not unplaced, (f"modules in no layer: {unplaced}; move each into a package of LAYERS "
                          f"(tests/unit/test_import_layers.py) or add its prefix there")


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles (move the shared piece down a layer):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_no_upward_imports():
    found = upward_edges(import_graph())
    assert not found, "imports that run up the layers:\n" + "\n".join(found)


def test_the_graph_sees_function_level_and_relative_imports(tmp_path: Path):
    pkg = tmp_path / "trainer"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("def f():\n    from trainer.sub import low\n")
    (pkg / "sub" / "low.py").write_text("from . import other\nfrom ..errors import f\n")
    (pkg / "sub" / "other.py").write_text("")
    graph = import_graph(tmp_path)
    assert graph["trainer.errors"] == {"trainer.sub.low"}
    assert graph["trainer.sub.low"] == {"trainer.sub.other", "trainer.errors"}
    assert circles(graph) == [["trainer.errors", "trainer.sub.low"]]


if __name__ == "__main__":
    g = import_graph()
    for c in circles(g):
        print("circle:", " <-> ".join(c))
    for e in upward_edges(g):
        print("upward:", e)
