"""Package namespaces whose names are imported on first use (PEP 562), as transformers' own top level is, so
that importing a package costs nothing until one of its names is used: the command line's parsers and
`--help` run without torch.

A package declares its names once, as the `from .module import name` statements of an
`if TYPE_CHECKING:` block (which type checkers and editors read), and ends with
`__getattr__, __dir__ = lazy_exports(__name__, __file__)`; the block is read from the source, not run.
"""

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def exported_names(init_file: str | Path) -> dict[str, str]:
    """Each name the `if TYPE_CHECKING:` block of a package's `__init__.py` imports: the relative module
    that defines it (".translator")."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    names = {}
    for statement in tree.body:
        if isinstance(statement, ast.If) and ast.unparse(statement.test) == "TYPE_CHECKING":
            for imported in statement.body:
                if isinstance(imported, ast.ImportFrom) and imported.level:
                    module = "." * imported.level + (imported.module or "")
                    names.update({alias.asname or alias.name: module for alias in imported.names})
    return names


def lazy_exports(
    package: str, init_file: str | Path, before_import: Callable[[str], None] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of package `package` whose `__init__.py` is `init_file`: a name of
    `exported_names` is imported from its module on first use and kept in the package's namespace;
    `before_import(name)`, if given, runs first (the package root registers the model with transformers
    there)."""
    modules = exported_names(init_file)

    def __getattr__(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before_import is not None:
            before_import(name)
        value = getattr(importlib.import_module(modules[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *modules})

    return __getattr__, __dir__
