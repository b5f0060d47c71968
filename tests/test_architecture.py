"""The shape docs/architecture.md promises, checked on the source: no function over 60 lines
(modules are cut where concepts part, not at a line count), no object's underscore members
used from outside the module that defines them (the seams are protocols and public methods),
and packages whose ``__init__.py`` only names what their modules hold."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("facade", "stores", "spark", "confluent", "migrations", "console", "cli", "demo")
MAX_FUNCTION_LINES = 60
#: Underscore names that are other libraries' public API: confluent-kafka's error codes
#: (``KafkaError._PARTITION_EOF``), SQLAlchemy's ``Row._mapping``, namedtuple's methods.
FOREIGN = frozenset({"_mapping", "_replace", "_asdict", "_fields"})
FOREIGN_OWNERS = frozenset({"KafkaError"})


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_the_packages_hold_sources() -> None:
    assert len(list(sources())) > 50


@pytest.mark.parametrize("path", list(sources()), ids=lambda p: str(p.relative_to(ROOT)))
def test_function_sizes(path: Path) -> None:
    text = path.read_text()
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []


def _face_code(tree: ast.Module) -> list[str]:
    """What an ``__init__.py`` holds besides its docstring, imports (guarded or not) and
    ``__all__``."""
    found = []
    for node in tree.body[1:] if ast.get_docstring(tree) else tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Try) and all(  # an import guard naming the missing extra
            isinstance(inner, ast.Import | ast.ImportFrom) for inner in node.body
        ):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            "__all__"
        ]:
            continue
        found.append(f"line {node.lineno}: {type(node).__name__}")
    return found


@pytest.mark.parametrize(
    "path",
    [p for p in sources() if p.name == "__init__.py"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_a_package_face_holds_no_code(path: Path) -> None:
    assert _face_code(ast.parse(path.read_text())) == []


def _defined_private(tree: ast.AST) -> set[str]:
    """Underscore names this module defines: functions, classes, attributes it assigns,
    module names and ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                if isinstance(target, ast.Name) and target.id == "__slots__":
                    value = node.value
                    if isinstance(value, ast.Tuple | ast.List):
                        names.update(e.value for e in value.elts if isinstance(e, ast.Constant))
    return {n for n in names if n.startswith("_")}


def _foreign_private(tree: ast.AST) -> list[str]:
    own = _defined_private(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr, owner = node.attr, node.value
        if not attr.startswith("_") or attr.startswith("__") or attr in own | FOREIGN:
            continue
        if isinstance(owner, ast.Name) and owner.id in {"self", "cls"} | FOREIGN_OWNERS:
            continue
        found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", list(sources()), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_member_of_another_module(path: Path) -> None:
    assert _foreign_private(ast.parse(path.read_text())) == []


def test_the_check_finds_a_private_member_of_another_module() -> None:
    tree = ast.parse("def f(sub):\n    return sub._fetcher.poll()\n")
    assert _foreign_private(tree) == ["line 2: sub._fetcher"]
    same = ast.parse("class A:\n    def __init__(self):\n        self._x = 1\n"
                     "    def eq(self, other):\n        return other._x\n")  # fmt: skip
    assert _foreign_private(same) == []


# -- one owner of a subscriber's partitions ------------------------------------------------

#: The calls that change what a consumer holds, where it reads, what it fetches and commits.
CONSUMER_CALLS = frozenset(
    {"assign", "incremental_assign", "unassign", "incremental_unassign"}
    | {"pause", "resume", "seek", "commit"}
)
#: The partition state a subscriber keeps, per partition.
POSITION_FIELDS = frozenset({"next", "last_read", "confirmed", "assigned"})
#: The one module that calls a subscriber's consumer and writes its partitions' state.
STATE = "facade/consumer/state.py"
#: Modules that call consumers of their own, never a subscriber's: why each may.
OWN_CONSUMERS = {
    # The shared fetch's consumer is the process's, read on behalf of its subscribers.
    "facade/consumer/shared_fetch.py",
    # Throwaway readers confirming log ends and timestamps on a broker that answers early.
    "facade/kafka/compat.py",
    # The retry tiers' reader: a consumer of its own, assigned the tier partitions by hand.
    "facade/receiving/tier_reader.py",
}


def _last_name(node: ast.expr) -> str:
    """``a.b._consumer`` -> ``_consumer``; ``consumer`` -> ``consumer``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _state_reaches(tree: ast.AST) -> list[str]:
    """Calls that change a consumer (``x.consumer.assign(...)``), and the partition state
    reached through a subscriber's parts (``positions.next``, ``parts.assigned``)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = _last_name(node.value).lower()
        calls = node.attr in CONSUMER_CALLS and "consumer" in owner
        reaches = node.attr in POSITION_FIELDS and any(w in owner for w in ("position", "parts"))
        if calls or reaches:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(
    "path",
    [p for package in ("facade", "cli", "demo") for p in (ROOT / package).rglob("*.py")],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_only_the_partition_state_changes_a_subscribers_consumer(path: Path) -> None:
    """``PartitionState`` is the one writer of a subscriber's partitions and the one caller of
    its consumer's assign, unassign, pause, resume, seek and commit (docs/architecture.md)."""
    where = str(path.relative_to(ROOT))
    if where == STATE or where in OWN_CONSUMERS:
        return
    assert _state_reaches(ast.parse(path.read_text())) == []


def test_the_check_finds_a_consumer_call_and_a_position_reached() -> None:
    tree = ast.parse(
        "def f(self, positions):\n"
        "    self._consumer.seek(tp)\n"
        "    positions.last_read.pop(0)\n"
        "    sub.seek(0)\n"
    )
    assert _state_reaches(tree) == ["line 2: self._consumer.seek", "line 3: positions.last_read"]


#: Where a subscriber's membership is chosen (``membership_of``), and the config whose
#: ``grouped`` it reads (and checks its own settings by).
CHOOSES_MEMBERSHIP = frozenset({"facade/consumer/membership.py", "facade/config.py"})


def _grouped_reads(tree: ast.Module) -> list[str]:
    """Every read of an attribute named ``grouped``: asking a subscriber which kind it is."""
    return [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "grouped"
    ]


@pytest.mark.parametrize("path", list(sources()), ids=lambda p: str(p.relative_to(ROOT)))
def test_group_or_no_group_is_chosen_once(path: Path) -> None:
    """In a consumer group or not is chosen once, when a subscriber is built (``Membership``);
    everything else calls the membership instead of asking ``grouped``."""
    if str(path.relative_to(ROOT)) in CHOOSES_MEMBERSHIP:
        return
    assert _grouped_reads(ast.parse(path.read_text())) == []


def test_the_check_finds_a_grouped_read() -> None:
    tree = ast.parse("if self.grouped:\n    pass\nx = config.grouped and y\n")
    assert _grouped_reads(tree) == ["line 1: self.grouped", "line 3: config.grouped"]
