"""The package's layout is its architecture (docs/architecture.md): the model's own files at the root, which
`save_pretrained` copies next to the weights, and one folder for each wing, layered so that a wing imports
only from the wings below it; and no module imports itself back through a loop."""

import ast
from pathlib import Path

import hf_vanilla_transformer

PACKAGE = Path(hf_vanilla_transformer.__file__).resolve().parent
# The model's files: what a saved model carries as its code (`trust_remote_code=True`).
MODEL_FILES = {
    "__init__",
    "__main__",
    "configuration_vanilla_transformer",
    "modeling_vanilla_transformer",
    "embeddings_vanilla_transformer",
    "generation_vanilla_transformer",
    "cpu_speedups",
    "hardware",
    "translation_pipeline",
}
# Lowest first: a module may import from its own layer and the layers before it.
LAYERS = [
    "",  # the model's files at the root
    "common",
    "evaluation",
    "inference",
    "conversion",
    "training",
    "hub",
    "figures",
    "serving",
    "commands",
]


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name below it ("" for its __init__), packages by their name."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def syntax(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def imports(name: str, path: Path, known: dict[str, Path], tree: ast.AST | None = None) -> set[str]:
    """The package modules that module `name` (at `path`) imports, anywhere in its code (lazy imports too),
    or in `tree` where given."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    package = [part for part in package if part]
    found = set()
    for node in ast.walk(tree or syntax(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] + (node.module or "").split(".")
            elif (node.module or "").startswith(hf_vanilla_transformer.__name__):
                base = node.module.split(".")[1:]
            else:
                continue
            base = [part for part in base if part]
            for alias in node.names:
                candidate = ".".join([*base, alias.name])
                found.add(candidate if candidate in known else ".".join(base))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(hf_vanilla_transformer.__name__ + "."):
                    found.add(alias.name.split(".", 1)[1])
    return {module for module in found if module in known and module != name}


def layer(name: str) -> int:
    top = "commands" if name == "__main__" else name.split(".")[0]  # `python -m` runs the commands
    return LAYERS.index(top if top in LAYERS else "")


def test_the_root_holds_the_model_files_and_the_wings():
    files = {path.stem for path in PACKAGE.glob("*.py")}
    assert files == MODEL_FILES
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == set(LAYERS[1:])


def test_each_wing_imports_only_from_the_wings_below_it():
    known = modules()
    upward = [
        f"{name} imports {target}"
        for name, path in known.items()
        for target in imports(name, path, known)
        if layer(target) > layer(name)
    ]
    assert upward == []


def test_the_model_files_import_each_other_only():
    known = modules()
    for name in MODEL_FILES - {"__init__", "__main__"}:
        assert all(target in MODEL_FILES for target in imports(name, known[name], known)), name


def test_no_module_imports_itself_back():
    """No loop through module-level imports. A package's __init__ that re-exports its own modules, which
    import each other, makes none."""
    known = modules()
    edges = {}
    for name, path in known.items():
        top_level = ast.Module(body=[node for node in syntax(path).body if isinstance(node, ast.ImportFrom)])
        targets = imports(name, path, known, top_level)
        if path.name == "__init__.py":
            targets = {target for target in targets if not target.startswith(f"{name}.") or not name}
        edges[name] = targets
    state: dict[str, int] = {}
    loops = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                loops.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert loops == []
