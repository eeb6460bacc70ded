"""The package's dependency picture: every module imports only modules of its own layer or below,
so the pure pieces (sampling, the verifier, the formulas) never depend on what runs models."""

import ast
from pathlib import Path

import specdecode

ROOT = Path(specdecode.__file__).parent
# Lowest first. A module belongs to the layer of its longest matching prefix.
LAYERS = [
    ["specdecode.options"],
    ["specdecode.sampling", "specdecode.models.base"],
    ["specdecode.verify", "specdecode.formulas"],
    ["specdecode.gamma", "specdecode.models", "specdecode.drafters", "specdecode.prefix"],
    ["specdecode.decode"],
    ["specdecode.stats", "specdecode.text", "specdecode.render"],
    ["specdecode.batch"],
    ["specdecode.analysis", "specdecode.bench", "specdecode.distill", "specdecode.server"],
    # server.ray runs `specdecode serve` (the CLI's) on every replica of a Ray Serve application
    ["specdecode.cli", "specdecode.__main__", "specdecode", "specdecode.server.ray"],
]


def layer(module: str) -> int:
    best = max(((len(p), i) for i, names in enumerate(LAYERS) for p in names
                if module == p or module.startswith(p + ".")), default=None)
    assert best is not None, f"{module} is in no layer"
    return best[1]


def module_name(path: Path) -> str:
    parts = ["specdecode", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """specdecode modules a file imports, at any depth of the file (lazy imports count too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("specdecode"):
                # `from . import x` names submodules; `from .m import f` names m
                names = [f"{target}.{a.name}" for a in node.names] if not node.module else [target]
                found.update(n for n in names if (ROOT.parent / (n.replace(".", "/") + ".py")).exists()
                             or (ROOT.parent / n.replace(".", "/")).is_dir() or n == target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("specdecode"))
    return found


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        name = module_name(path)
        for target in imports(path):
            if layer(target) > layer(name):
                upward.append(f"{name} (layer {layer(name)}) imports {target} (layer {layer(target)})")
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """The rule above would catch the loop reaching up into the analysis tools."""
    assert layer("specdecode.decode") < layer("specdecode.analysis.measure")
    assert layer("specdecode.formulas") < layer("specdecode.gamma") < layer("specdecode.decode")
    assert "specdecode.analysis.measure" in imports(ROOT / "cli.py")
