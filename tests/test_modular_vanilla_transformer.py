"""`modular_vanilla_transformer.py`, the source transformers' modular converter
(`utils/modular_model_converter.py`) generates `modeling_vanilla_transformer.py` from, checked without the
converter: it defines every class, function and module-level name of the modeling file with the modeling
file's code, written the way the converter reads it, and its Marian/BART bases exist in the installed
transformers and leave nothing of theirs for the converter to copy into the generated file."""

import ast
import functools
import importlib
from pathlib import Path

import pytest
import transformers
from packaging import version

import hf_vanilla_transformer

MODEL_FOLDER = Path(hf_vanilla_transformer.__file__).resolve().parent / "vanilla_transformer"
MODELING = MODEL_FOLDER / "modeling_vanilla_transformer.py"
MODULAR = MODEL_FOLDER / "modular_vanilla_transformer.py"
PREFIX = "VanillaTransformer"
# The transformers modules whose classes the modular file subclasses, with the prefix the converter renames.
COUNTERPART_MODULES = {
    "transformers.models.marian.modeling_marian": "Marian",
    "transformers.models.bart.modeling_bart": "Bart",
}
# Members of the Marian/BART bases that the modular file neither overrides nor drops, which the converter
# would copy unchanged into the generated file: none.
INHERITED_UNCHANGED: list[str] = []
# Classes and methods whose docstring the converter takes from the base, as they have none of their own: none.
DOCSTRINGS_FROM_COUNTERPARTS: list[str] = []
# The transformers release (constraints.txt) whose Marian and BART classes the modular file is written for:
# older ones have other members (5.4's BartPreTrainedModel has `_skip_keys_device_placement`).
WRITTEN_AGAINST = "5.24.0"

Member = ast.FunctionDef | ast.Assign | ast.AnnAssign


def top_level(path: Path) -> dict[str, ast.stmt]:
    """The classes, functions and names assigned at module level of the file at `path`, by name."""
    found: dict[str, ast.stmt] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = node
    return found


@functools.cache
def counterpart_names() -> dict[str, str]:
    """The names the modular file imports from Marian's and BART's modeling files, with their module."""
    names = {}
    for node in ast.parse(MODULAR.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module in COUNTERPART_MODULES:
            names.update({alias.name: node.module for alias in node.names})
    return names


def member_name(node: Member) -> str:
    if isinstance(node, ast.FunctionDef):
        return node.name
    return ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)


def members(cls: ast.ClassDef) -> dict[str, Member]:
    """The methods and class attributes of `cls`, by name."""
    return {
        member_name(node): node
        for node in cls.body
        if isinstance(node, ast.FunctionDef | ast.Assign | ast.AnnAssign)
    }


def is_dropped(node: Member) -> bool:
    """Whether `node` is the converter's sign to leave the base's member out: `name = AttributeError()` for a
    class attribute, a method whose body starts by raising an `...Error(...)` for a method."""
    if isinstance(node, ast.FunctionDef):
        first = node.body[0]
        return (
            isinstance(first, ast.Raise)
            and isinstance(first.exc, ast.Call)
            and ast.unparse(first.exc.func).endswith("Error")
        )
    value = node.value
    return (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "AttributeError"
    )


def docstring(node: ast.ClassDef | ast.FunctionDef) -> str | None:
    return ast.get_docstring(node, clean=False)


class AsGenerated(ast.NodeTransformer):
    """A modular method as the converter writes it: `Base.method(self, ...)`, where `Base` is a base of the
    generated class (or `nn.Module` below `GradientCheckpointingLayer`, or `PreTrainedModel` below a
    `...PreTrainedModel`), becomes `super().method(...)`, and `@no_inherit_decorator` goes."""

    def __init__(self, bases: list[str]) -> None:
        self.bases = bases

    def is_base(self, name: str) -> bool:
        return (
            name in self.bases
            or (name == "nn.Module" and "GradientCheckpointingLayer" in self.bases)
            or (name == "PreTrainedModel" and any("PreTrainedModel" in base for base in self.bases))
        )

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.decorator_list = [d for d in node.decorator_list if ast.unparse(d) != "no_inherit_decorator"]
        self.generic_visit(node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and self.is_base(ast.unparse(node.func.value)):
            node.func.value = ast.Call(func=ast.Name("super", ast.Load()), args=[], keywords=[])
            if node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self":
                node.args = node.args[1:]
        return node


def replaced_by_the_base(method: ast.FunctionDef) -> list[str]:
    """The statements of `method` that the converter replaces with the base's code: a bare
    `super().<method>(...)` or `return super().<method>(...)` at the top of its body."""
    return [
        ast.unparse(statement)
        for statement in method.body
        if isinstance(statement, ast.Expr | ast.Return)
        and isinstance(call := statement.value, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and ast.unparse(call.func.value) == "super()"
        and call.func.attr == method.name
    ]


def same_code(modular: ast.AST, modeling: ast.AST) -> bool:
    return ast.dump(modular) == ast.dump(modeling)


def counterpart_base(cls: ast.ClassDef) -> str | None:
    """The Marian/BART class that the modular class `cls` subclasses, if any."""
    names = counterpart_names()
    return next((ast.unparse(b) for b in cls.bases if ast.unparse(b) in names), None)


@functools.cache
def counterpart_class(name: str) -> ast.ClassDef:
    """The definition of the Marian/BART class `name` in the installed transformers."""
    module = importlib.import_module(counterpart_names()[name])
    return next(
        node
        for node in ast.parse(Path(module.__file__).read_text(encoding="utf-8")).body
        if isinstance(node, ast.ClassDef) and node.name == name
    )


def renamed(name: str) -> str:
    """A Marian/BART name as the converter renames it for this model."""
    for prefix in COUNTERPART_MODULES.values():
        name = name.replace(prefix, PREFIX)
    return name


def test_the_modular_file_defines_what_the_modeling_file_defines():
    assert top_level(MODULAR).keys() == top_level(MODELING).keys()


def test_functions_and_module_level_names_are_the_modeling_files():
    modeling, modular = top_level(MODELING), top_level(MODULAR)
    different = [
        name
        for name, node in modeling.items()
        if not isinstance(node, ast.ClassDef) and not same_code(modular[name], node)
    ]
    assert different == []


def test_each_class_has_the_modeling_files_code():
    """Same docstring, decorators and members; the bases the converter gives it (a Marian/BART base's own,
    renamed, or the modular class's where it has none); each method as the converter writes it. A Marian/BART
    base is the class of the same role: its name renamed is the class's."""
    modeling, modular = top_level(MODELING), top_level(MODULAR)
    different = []
    for name, cls in modular.items():
        if not isinstance(cls, ast.ClassDef):
            continue
        expected = modeling[name]
        base = counterpart_base(cls)
        bases = (
            [renamed(ast.unparse(b)) for b in counterpart_class(base).bases]
            if base
            else [ast.unparse(b) for b in cls.bases]
        )
        if base and renamed(base) != name:
            different.append(f"{name} subclasses {base}")
        if bases != [ast.unparse(b) for b in expected.bases]:
            different.append(f"{name} bases {bases}")
        if docstring(cls) != docstring(expected):
            different.append(f"{name} docstring")
        if list(map(ast.dump, cls.decorator_list)) != list(map(ast.dump, expected.decorator_list)):
            different.append(f"{name} decorators")
        own = {key: node for key, node in members(cls).items() if not is_dropped(node)}
        wanted = members(expected)
        if own.keys() != wanted.keys():
            different.append(f"{name} members {sorted(own.keys() ^ wanted.keys())}")
        generated = AsGenerated(bases) if base else ast.NodeTransformer()
        different += [
            f"{name}.{key}"
            for key, node in own.items()
            if key in wanted and not same_code(generated.visit(node), wanted[key])
        ]
    assert different == []


@pytest.mark.skipif(
    version.parse(transformers.__version__) < version.parse(WRITTEN_AGAINST),
    reason=f"the modular file is written against transformers {WRITTEN_AGAINST}'s Marian and BART classes",
)
def test_the_marian_and_bart_bases_leave_nothing_to_copy():
    """Each Marian/BART base exists in the installed transformers; every member of it is overridden or
    dropped (and a dropped one exists there); no decorators, return annotation or code are taken from it (a
    `super()` call the converter would replace with the base's code); and the only text the converter takes
    from a base is a docstring where the class or method has none."""
    modular = top_level(MODULAR)
    inherited, docstrings, not_there = [], [], []
    for name, cls in modular.items():
        base = counterpart_base(cls) if isinstance(cls, ast.ClassDef) else None
        if base is None:
            continue
        module = importlib.import_module(counterpart_names()[base])
        assert isinstance(getattr(module, base, None), type), f"{module.__name__} has no class {base}"
        counterpart = counterpart_class(base)
        if docstring(counterpart) and not docstring(cls):
            docstrings.append(f"{name} <- {base}")
        if counterpart.decorator_list and not cls.decorator_list:
            inherited.append(f"{base} decorators")
        theirs, mine = members(counterpart), members(cls)
        not_there += [f"{name}.{key}" for key, node in mine.items() if is_dropped(node) and key not in theirs]
        inherited += [
            f"{base}.{key} code in {statement}"
            for key, node in mine.items()
            if isinstance(node, ast.FunctionDef)
            for statement in replaced_by_the_base(node)
        ]
        for key, node in theirs.items():
            if key not in mine:
                inherited.append(f"{base}.{key}")
            elif isinstance(node, ast.FunctionDef) and not is_dropped(mine[key]):
                if node.decorator_list and not mine[key].decorator_list:
                    inherited.append(f"{base}.{key} decorators")
                if node.returns and not mine[key].returns:
                    inherited.append(f"{base}.{key} return annotation")
                if docstring(node) and not docstring(mine[key]):
                    docstrings.append(f"{name}.{key} <- {base}.{key}")
    assert not_there == []
    assert inherited == INHERITED_UNCHANGED
    assert docstrings == DOCSTRINGS_FROM_COUNTERPARTS


def test_the_modular_file_imports_and_subclasses_its_counterparts():
    module = importlib.import_module("hf_vanilla_transformer.vanilla_transformer.modular_vanilla_transformer")
    for name, cls in top_level(MODULAR).items():
        base = counterpart_base(cls) if isinstance(cls, ast.ClassDef) else None
        if base is not None:
            counterpart = getattr(importlib.import_module(counterpart_names()[base]), base)
            assert issubclass(getattr(module, name), counterpart)
