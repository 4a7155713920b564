"""The packages import only downward: each module of cronman sits in a layer, and no import run at
run time (at the top of a module or inside a function) names a module of a higher layer. Imports
under ``if TYPE_CHECKING:`` are annotations only and may name any layer."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# lowest first; a module may import its own layer and those below it
LAYERS = [
    ("cronman", "cronman.errors", "cronman.logs"),  # the package itself holds only __version__
    ("cronman.model",),
    ("cronman.client",),  # the API's typed client: the model and requests
    ("cronman.redis",),
    ("cronman.settings",),
    ("cronman.store",),
    ("cronman.dev",),
    ("api", "scheduler_node", "bench"),
    ("cronman.cli", "cronman.__main__"),  # the command starts every process
]
# the services never start a development server nor reach for the command's code
FORBIDDEN = {"api": ("cronman.dev", "cronman.cli"), "scheduler_node": ("cronman.dev", "cronman.cli")}


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and (best is None or len(prefix) > best[1]):
                best = (rank, len(prefix))
    return None if best is None else best[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of each import outside ``if TYPE_CHECKING:`` blocks."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def upward_imports() -> list[str]:
    bad = []
    for top in ("cronman", "api", "scheduler_node", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            importer = module_name(path)
            own = layer_of(importer)
            assert own is not None, importer
            for line, imported in runtime_imports(ast.parse(path.read_text(), str(path))):
                rank = layer_of(imported)
                where = f"{path.relative_to(ROOT)}:{line} imports {imported}"
                if rank is not None and rank > own:
                    bad.append(where)
                banned = FORBIDDEN.get(importer.split(".")[0], ())
                if any(imported == b or imported.startswith(b + ".") for b in banned):
                    bad.append(where)
    return bad


def test_imports_only_downward() -> None:
    assert upward_imports() == []


def test_every_module_has_a_layer() -> None:
    for path in (ROOT / "cronman").rglob("*.py"):
        assert layer_of(module_name(path)) is not None, path


if __name__ == "__main__":
    print("\n".join(upward_imports()))
