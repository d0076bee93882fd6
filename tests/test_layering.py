"""The one-way dependency rule: lowering <- partitioner <- ipujax.

Each package is parsed with `ast`; an absolute import of a package further down the pipeline is
a violation. Relative imports (`from . import x`) stay inside their package and are allowed.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "lowering": frozenset({"partitioner", "ipujax"}),
    "partitioner": frozenset({"ipujax"}),
    "ipujax": frozenset(),
}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in the tree; relative ones are skipped."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def violations(path: Path, forbidden: frozenset[str]) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [
        f"{where}:{line}: imports {module}"
        for line, module in imported_modules(tree)
        if module.partition(".")[0] in forbidden
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_lower_layers(package: str) -> None:
    forbidden = FORBIDDEN[package]
    paths = sorted((ROOT / package).rglob("*.py"))
    bad = [v for path in paths for v in violations(path, forbidden)]
    assert not bad, f"{package} must not import {sorted(forbidden)}:\n" + "\n".join(bad)


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    source = "from . import local\nimport jax\nfrom ipujax.target import T\nimport partitioner.x\n"
    module = tmp_path / "module.py"
    module.write_text(source, encoding="utf-8")
    found = violations(module, FORBIDDEN["lowering"])
    assert found == [
        f"{module}:3: imports ipujax.target",
        f"{module}:4: imports partitioner.x",
    ]
