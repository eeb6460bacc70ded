"""The package's dependency picture: every module imports only modules of its own layer or below,
so the pure pieces (sampling, the verifier, the formulas) never depend on what runs models; and no
modules import each other in a circle, within a layer either."""

import ast
from pathlib import Path

import specdecode

ROOT = Path(specdecode.__file__).parent
# Lowest first. A module belongs to the layer of its longest matching prefix.
LAYERS = [
    ["specdecode.checks", "specdecode.defaults", "specdecode.lazy", "specdecode.progress", "specdecode.prompts",
     "specdecode.detokenize"],
    ["specdecode.sampling", "specdecode.grammar", "specdecode.models.base"],
    ["specdecode.verify", "specdecode.formulas"],
    ["specdecode.gamma", "specdecode.scheduler", "specdecode.models", "specdecode.drafters", "specdecode.prefix"],
    ["specdecode.decode"],
    ["specdecode.stats", "specdecode.text", "specdecode.render"],
    ["specdecode.batch"],
    ["specdecode.analysis", "specdecode.bench", "specdecode.distill", "specdecode.server"],
    ["specdecode.cli", "specdecode.__main__", "specdecode"],
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
    assert "specdecode.analysis.measure" in imports(ROOT / "cli" / "analysis.py")


def module_graph() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports."""
    return {module_name(path): imports(path) for path in sorted(ROOT.rglob("*.py"))}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as the modules along it, the first repeated at the end; None if it has none."""
    done, path = set(), []  # path: the modules being visited, each importing the next

    def visit(node: str) -> list[str] | None:
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if target in path:
                return path[path.index(target):] + [target]
            if target not in done and (cycle := visit(target)):
                return cycle
        path.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done and (cycle := visit(node)):
            return cycle
    return None


def test_no_modules_import_each_other_in_a_circle():
    cycle = find_cycle(module_graph())
    assert cycle is None, "an import cycle: " + " -> ".join(cycle)


def test_the_check_sees_a_cycle():
    """The check above would catch a circle of any length, a module importing itself included."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"y"}, "y": {"z", "y"}, "z": set()}) == ["y", "y"]
    # the circle there was: the server importing the command line back
    graph = module_graph()
    assert "specdecode.server.build" in graph["specdecode.cli.serve"]
    graph["specdecode.server.build"] = graph["specdecode.server.build"] | {"specdecode.cli.serve"}
    assert find_cycle(graph) == ["specdecode.cli.serve", "specdecode.server.build", "specdecode.cli.serve"]


def test_the_loop_and_the_batch_ask_drafters_and_models_through_their_protocols():
    """No hasattr/getattr probes of a drafter or a model in the decode loop or the batch engine: what
    they use is declared (`Drafter`, `Model`, `Capabilities`)."""
    for module in ("decode.py", "batch.py"):
        tree = ast.parse((ROOT / module).read_text())
        probes = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")]
        assert not probes, f"{module} probes at lines {probes}"


def test_each_setting_has_one_default_which_the_parser_the_server_the_engine_and_the_batch_share():
    """`specdecode.defaults` holds them; `serve`'s parser, `ServeOptions`, `Engine` and `Batch` agree
    with it, and none writes the number again (its default is the constant's name)."""
    import inspect

    from specdecode import defaults
    from specdecode.batch import Batch
    from specdecode.cli.parser import build_parser
    from specdecode.server.build import ServeOptions
    from specdecode.server.engine import Engine

    serve = build_parser().parse_args(["serve"])
    engine, batch = inspect.signature(Engine).parameters, inspect.signature(Batch).parameters
    settings = {"max_gamma": defaults.MAX_GAMMA, "max_batch": defaults.MAX_BATCH, "prompt_rows": defaults.PROMPT_ROWS,
                "max_queue": defaults.MAX_QUEUE}
    for name, value in settings.items():
        assert getattr(serve, name) == getattr(ServeOptions(), name) == value, name
        assert engine[name].default == value, name
        if name in batch:
            assert batch[name].default == value, name
    assert serve.prefix_memory == ServeOptions().prefix_memory == defaults.PREFIX_MIB
    assert engine["prefix_bytes"].default == batch["prefix_bytes"].default == defaults.PREFIX_MIB << 20
    assert (serve.host, serve.port, serve.max_body_bytes) == (defaults.HOST, defaults.PORT, defaults.MAX_BODY_BYTES)
    import re

    written = re.compile(r'(serve|gen|bench)\.add_argument\("--(max-batch|prompt-rows|prefix-memory|max-queue|max-gamma)", '
                         r'type=int, default=\d'
                         r"|(max_batch|prompt_rows|prefix_bytes|prefix_memory|max_queue|max_gamma): int = \d")
    for module in ("cli/parser.py", "server/build.py", "server/engine.py", "batch.py", "gamma.py"):
        assert not written.search((ROOT / module).read_text()), (module, written.search((ROOT / module).read_text()))


def test_create_app_only_wires_the_routes_defined_at_module_level():
    """create_app builds the state and registers the routes (`server/routes/`); it defines none of
    them: no route, handler or helper closes over it (no nested async def, no decorated nested
    function), and it stays short."""
    tree = ast.parse((ROOT / "server" / "app.py").read_text())
    create_app = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "create_app")
    lines = create_app.end_lineno - create_app.lineno + 1
    assert lines < 60, f"create_app has {lines} lines"
    nested = [node for node in ast.walk(create_app) if node is not create_app
              and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    asynchronous = [node.name for node in nested if isinstance(node, ast.AsyncFunctionDef)]
    decorated = [node.name for node in nested if node.decorator_list]
    assert not asynchronous and not decorated, (asynchronous, decorated)
    routes = [node for node in ast.walk(create_app) if isinstance(node, ast.Call)
              and isinstance(node.func, ast.Attribute) and node.func.attr == "add_api_route"]
    assert len(routes) == 11
    # each endpoint is a module's function: routes.<module>.<name>
    assert all(isinstance(call.args[1], ast.Attribute) and isinstance(call.args[1].value, ast.Name)
               for call in routes), [ast.unparse(call.args[1]) for call in routes]


def test_an_architecture_is_declared_in_its_own_module_only():
    """The native loader, model, strict reading and C layers name no architecture: what each adds to
    a Llama is declared in `models/native/arch/<name>.py` and reaches them as data (a `Hyper`, a
    layer's optional tensors)."""
    from specdecode.models.native.arch import ARCHITECTURES

    native = ROOT / "models" / "native"
    files = [*native.glob("*.py"), *(native / "csrc").glob("*.[ch]")]
    for path in files:
        strings = ([n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
                    and isinstance(n.value, str)] if path.suffix == ".py" else [path.read_text()])
        named = [a for a in ARCHITECTURES for text in strings if f'"{a}"' in text or text == a]
        assert not named, f"{path.name} names the architecture {named[0]!r}"
    assert all((native / "arch" / f"{name}.py").exists() for name in ARCHITECTURES)


def test_a_built_in_drafter_is_one_entry_of_the_kinds_table(monkeypatch):
    """A drafter added to `drafters.spec.KINDS` alone is a spec the library, the command line's help,
    the error for unknown names, the server's shared memory and Ray's routing all know."""
    import argparse
    import json

    from specdecode.cli.parser import build_parser
    from specdecode.drafters import PromptLookupDrafter
    from specdecode.drafters import spec as drafters
    from specdecode.server.engine import Engine
    from specdecode.server.ray import route_key
    from toy import ToyModel

    made = []
    echo = drafters.Kind("echo", "proposes what prompt lookup proposes, for this test",
                         build=lambda argument, target, memory: made.append(memory) or PromptLookupDrafter(),
                         memory=lambda target, max_gamma: {"shared by": "the draft's requests"})
    monkeypatch.setattr(drafters, "KINDS", (*drafters.KINDS, echo))
    assert drafters.DraftSpec("echo").model_path is None and not drafters.DraftSpec("echo").is_user
    assert isinstance(drafters.make_drafter("echo", ToyModel(8, seed=0)), PromptLookupDrafter) and made == [None]
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("generate", "serve"):
        assert "echo: proposes what prompt lookup proposes" in " ".join(commands.choices[command].format_help().split())
    assert "echo" in drafters.drafter_names()
    body = json.dumps({"prompt": "hi", "user": "u1", "specdecode": {"draft": "echo"}}).encode()
    assert route_key(body, "lookup") == "user:u1"  # requests that share its memory go to one replica
    engine = Engine(ToyModel(8, seed=1), {"echo": "echo", "lookup": "lookup"}, "echo")
    try:
        engine._factories["echo"]()
        engine._factories["echo"]()
        assert made[1:] == [{"shared by": "the draft's requests"}] * 2 and made[1] is made[2]
    finally:
        engine.close()


def test_a_requests_decoding_fields_are_one_object_from_parsing_to_the_batch():
    """The server's parsed `Request` carries its decoding fields in one `batch.Settings`, the object
    `Batch.submit` takes, and restates none of them."""
    import inspect
    from dataclasses import fields

    from specdecode.batch import Batch, Settings
    from specdecode.server.request import Request, parse_request

    decoding = {f.name for f in fields(Settings)}
    assert not {f.name for f in fields(Request)} & (decoding | {"max_tokens", "n_max", "n_min"})
    assert list(inspect.signature(Batch.submit).parameters)[:4] == ["self", "prompt_ids", "drafter", "settings"]
    request = parse_request({"model": "m", "prompt": "hi", "max_tokens": 5, "seed": 3, "stop": ["x"], "temperature": 0,
                             "speculative": {"n_max": 2, "n_min": 1}, "specdecode": {"gamma": 4}}, "completion")
    assert request.settings == Settings(gamma=4, params=request.settings.params, max_new_tokens=5, seed=3,
                                        stop=("x",), max_draft=2, min_draft=1)
    assert request.settings.params.temperature == 0
