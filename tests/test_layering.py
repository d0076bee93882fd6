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


# ---- the front doors: a later stage imports only an earlier package's public names ---------

FRONT_DOORS = {
    "ipujax": ("lowering", "partitioner"),
    "partitioner": ("lowering",),
}


def private_imports(path: Path, packages: tuple[str, ...]) -> list[str]:
    """Imports in `path` that reach past the public `__init__` of `packages`: a submodule, a
    name outside the package's `__all__`, or an underscored name."""
    import importlib

    public = {p: set(importlib.import_module(p).__all__) for p in packages}
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top, _, rest = alias.name.partition(".")
                if top in packages and rest:
                    found.append(f"{where}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top, _, rest = node.module.partition(".")
            if top not in packages:
                continue
            if rest:
                found.append(f"{where}:{node.lineno}: from {node.module} import ...")
                continue
            for alias in node.names:
                if alias.name.startswith("_") or alias.name not in public[top]:
                    found.append(f"{where}:{node.lineno}: from {top} import {alias.name}")
    return found


@pytest.mark.parametrize("package", sorted(FRONT_DOORS))
def test_package_uses_only_public_names_of_earlier_stages(package: str) -> None:
    paths = sorted((ROOT / package).rglob("*.py"))
    bad = [v for path in paths for v in private_imports(path, FRONT_DOORS[package])]
    assert not bad, f"{package} reaches past a front door:\n" + "\n".join(bad)


def test_front_door_checker_catches_private_imports(tmp_path: Path) -> None:
    source = (
        "from partitioner import build\n"
        "from partitioner import _private\n"
        "from partitioner.memory.tiles import tile_memory\n"
        "import partitioner.tiles.schedule\n"
        "from partitioner import not_exported\n"
    )
    module = tmp_path / "module.py"
    module.write_text(source, encoding="utf-8")
    assert private_imports(module, ("partitioner",)) == [
        f"{module}:2: from partitioner import _private",
        f"{module}:3: from partitioner.memory.tiles import ...",
        f"{module}:4: import partitioner.tiles.schedule",
        f"{module}:5: from partitioner import not_exported",
    ]


# ---- no mesh axis name is special -------------------------------------------------------------


def axis_name_literals(path: Path, name: str = "dp") -> list[str]:
    """Places where `path` spells the axis name as a string: a string constant equal to it, or
    the quoted name anywhere in the text (an f-string part, a comment)."""
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = [
        f"{where}:{node.lineno}: the string {node.value!r}"
        for node in ast.walk(ast.parse(text, filename=str(path)))
        if isinstance(node, ast.Constant) and node.value == name
    ]
    for number, line in enumerate(text.splitlines(), 1):
        if f'"{name}"' in line or f"'{name}'" in line:
            found.append(f"{where}:{number}: {line.strip()}")
    return found


def naming_line(path: Path) -> str:
    """`where:line:` of the one line where the plan search names the axes of the meshes it
    builds (`MESH_AXES`, the convention the examples' sharding rules read)."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("MESH_AXES"):
            return f"{path.relative_to(ROOT)}:{number}:"
    raise AssertionError(f"{path} has no MESH_AXES line")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_spells_a_mesh_axis_name(package: str) -> None:
    """Replica (data-parallel) axes are derived from the shardings, never found by name. Only
    the plan search names axes, of meshes it builds, on one line."""
    paths = sorted((ROOT / package).rglob("*.py"))
    allowed = naming_line(ROOT / "ipujax" / "planning" / "candidates.py")
    bad = [v for path in paths for v in axis_name_literals(path) if not v.startswith(allowed)]
    assert not bad, "\n".join(bad)


def test_axis_name_checker_finds_the_name(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text('a = mesh.get("dp", 1)\nb = "dpx"\n', encoding="utf-8")
    assert len(axis_name_literals(module)) == 2  # the constant, and the quoted text


# ---- inside partitioner: each sub-package imports only the units below it --------------------

# Bottom to top; a unit is a root module or a sub-package. A unit may import itself and the
# units of earlier layers, never a later one (each sub-package's docstring says the same).
PARTITIONER_LAYERS: tuple[tuple[str, ...], ...] = (
    ("target", "errors"),
    ("mesh",),
    ("cost",),
    ("layout",),
    ("program",),
    ("memory", "sharding"),
    ("tiles",),
    ("phases",),
    ("step",),
    ("pipelines",),
    ("printer", "verify", "reuse"),
    ("passes",),
)


def unit_of(path: Path) -> str:
    """The unit a partitioner module belongs to: its sub-package, or its own name at the root."""
    parts = path.relative_to(ROOT / "partitioner").with_suffix("").parts
    return parts[0]


def layer_violations(path: Path) -> list[str]:
    layer = {unit: i for i, units in enumerate(PARTITIONER_LAYERS) for unit in units}
    mine = unit_of(path)
    if mine == "__init__":
        return []
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for line, module in imported_modules(tree):
        top, _, rest = module.partition(".")
        if top != "partitioner" or not rest:
            continue
        theirs = rest.partition(".")[0]
        if theirs != mine and layer[theirs] >= layer[mine]:
            found.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {theirs}")
    return found


def test_every_partitioner_unit_has_a_layer() -> None:
    units = {unit_of(p) for p in (ROOT / "partitioner").rglob("*.py")} - {"__init__"}
    layered = {u for units in PARTITIONER_LAYERS for u in units}
    assert units == layered


def test_partitioner_units_import_only_lower_layers() -> None:
    paths = sorted((ROOT / "partitioner").rglob("*.py"))
    bad = [v for path in paths for v in layer_violations(path)]
    assert not bad, "partitioner's layers run one way:\n" + "\n".join(bad)


def test_partitioner_root_is_small() -> None:
    root = sorted(p.name for p in (ROOT / "partitioner").glob("*.py"))
    assert len(root) <= 15, root
