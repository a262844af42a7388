"""The package's layout is its architecture (docs/architecture.md): the model folder, laid out as
transformers' own (`save_pretrained` copies its files next to the weights), the package's registrations at
the root, and one folder for each wing, layered so that a wing imports only from the wings below it; no
module imports itself back through a loop; the benchmarks import what the package has; and every module
path a docstring gives exists."""

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import hf_vanilla_transformer

PACKAGE = Path(hf_vanilla_transformer.__file__).resolve().parent
REPOSITORY = PACKAGE.parent
# Code outside the package that imports it.
OUTSIDE_CODE = ("benchmarks",)
# The model folder: what a saved model carries as its code (`trust_remote_code=True`).
MODEL_FOLDER = "vanilla_transformer"
MODEL_FILES = {
    "__init__",
    "configuration_vanilla_transformer",
    "modeling_vanilla_transformer",
    "generation_vanilla_transformer",
    "modular_vanilla_transformer",
}
# The root: the lazy namespace (`lazy_exports`), the registrations with transformers, `python -m`, and the
# translation pipeline.
ROOT_FILES = {"__init__", "__main__", "lazy_exports", "registration", "translation_pipeline"}
# Lowest first: a module may import from its own layer and the layers before it.
LAYERS = [
    MODEL_FOLDER,
    "",  # the root's files
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
        elif (dotted := _imported_by_importlib(node, package)) is not None:
            found.add(dotted)
    return {module for module in found if module in known and module != name}


def _imported_by_importlib(node: ast.AST, package: list[str]) -> str | None:
    """The package module that `importlib.import_module("...")` imports at `node`, where its name is a
    constant (absolute, or relative with the package as anchor); None for any other node."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return None
    target = node.args[0].value
    if target.startswith("."):
        level = len(target) - len(target.lstrip("."))
        return ".".join([*package[: len(package) - (level - 1)], target.lstrip(".")])
    prefix = hf_vanilla_transformer.__name__ + "."
    return target.removeprefix(prefix) if target.startswith(prefix) else None


def layer(name: str) -> int:
    top = "commands" if name == "__main__" else name.split(".")[0]  # `python -m` runs the commands
    return LAYERS.index(top if top in LAYERS else "")


def test_the_root_holds_the_model_folder_and_the_wings():
    files = {path.stem for path in PACKAGE.glob("*.py")}
    assert files == ROOT_FILES
    folders = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders == set(LAYERS) - {""}
    assert {path.stem for path in (PACKAGE / MODEL_FOLDER).glob("*.py")} == MODEL_FILES


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
    folder = {f"{MODEL_FOLDER}.{name}" for name in MODEL_FILES - {"__init__"}}
    for name in folder:
        assert all(target in folder for target in imports(name, known[name], known)), name


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


def test_importlib_imports_are_read():
    """A module imported by name through importlib counts as an import of it."""
    known = modules()
    code = "import importlib\nimportlib.import_module('hf_vanilla_transformer.training.pipeline')\n"
    found = imports("commands.example", PACKAGE / "commands" / "example.py", known, ast.parse(code))
    assert found == {"training.pipeline"}


def _outside_files() -> list[Path]:
    return sorted(path for folder in OUTSIDE_CODE for path in (REPOSITORY / folder).glob("*.py"))


def test_the_benchmarks_import_what_the_package_has():
    """Every name that the code outside the package imports from it exists there, so that moving a module
    or a name inside the package cannot leave a benchmark importing where nothing is."""
    missing = []
    for path in _outside_files():
        for node in ast.walk(syntax(path)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                hf_vanilla_transformer.__name__
            ):
                module = importlib.import_module(node.module)
                missing += [
                    f"{path.relative_to(REPOSITORY)}: {node.module}.{alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                    and importlib.util.find_spec(f"{node.module}.{alias.name}") is None
                ]
            elif isinstance(node, ast.Import):
                missing += [
                    f"{path.relative_to(REPOSITORY)}: {alias.name}"
                    for alias in node.names
                    if alias.name.startswith(hf_vanilla_transformer.__name__)
                    and importlib.util.find_spec(alias.name) is None
                ]
    assert missing == []


# A module path in a docstring: `module.name`, `wing/module.name` or `package.module`, in backquotes.
DOTTED = re.compile(r"`([A-Za-z_][\w/]*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
# Names of files, not of modules: `config.json`, `translation_pipeline.py`, and corpora by their language,
# `train.en`.
FILE_SUFFIXES = {"py", "json", "txt", "md", "gz", "csv", "tsv", "jsonl", "safetensors", "model", "spm"}
LANGUAGE_SUFFIX = re.compile(r"[a-z]{2}")


def _docstrings(tree: ast.AST) -> list[str]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [doc for node in ast.walk(tree) if isinstance(node, nodes) and (doc := ast.get_docstring(node))]


def _resolves(obj: object, names: list[str]) -> bool:
    for name in names:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def _external(parts: list[str]) -> bool:
    """Whether `parts` name something of another installed package (`torch.compile`,
    `ctranslate2.Translator`)."""
    try:
        return importlib.util.find_spec(parts[0]) is not None and _resolves(
            importlib.import_module(parts[0]), parts[1:]
        )
    except ImportError:
        return False


def stale_module_path(reference: str, known: dict[str, Path]) -> bool:
    """Whether `reference` (`engines.shortlist.build_shortlist`, `training/resume.whole_run_loss`) starts
    with the trailing parts of a package module's dotted name but names nothing in any such module. A
    reference that starts with no module's name (`model.config`) is not a module path."""
    parts = reference.replace("/", ".").split(".")
    if parts[-1] in FILE_SUFFIXES or (len(parts) == 2 and LANGUAGE_SUFFIX.fullmatch(parts[-1])):
        return False
    tried = False
    for cut in range(len(parts), 0, -1):
        for name in known:
            dotted = name.split(".") if name else []
            if len(dotted) >= cut and dotted[-cut:] == parts[:cut]:
                tried = True
                module = importlib.import_module(".".join([hf_vanilla_transformer.__name__, *dotted]))
                if _resolves(module, parts[cut:]):
                    return False
    return tried and not _external(parts)


def test_stale_module_paths_are_found():
    known = modules()
    assert stale_module_path("engines.shortlist.build_shortlist", known) is False
    assert stale_module_path("training/resume.whole_run_loss", known) is False
    assert stale_module_path("export.build_shortlist", known) is True
    assert stale_module_path("training._with_recorded_label_smoothing", known) is True
    assert stale_module_path("torch.compile", known) is False
    assert stale_module_path("model.config", known) is False


def test_every_module_path_a_docstring_gives_exists():
    known = modules()
    files = [*known.values(), *_outside_files()]
    stale = [
        f"{path.relative_to(REPOSITORY)}: {reference}"
        for path in files
        for doc in _docstrings(syntax(path))
        for reference in DOTTED.findall(doc)
        if stale_module_path(reference, known)
    ]
    assert stale == []
