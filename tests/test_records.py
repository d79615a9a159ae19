"""tasklock_cli.util.records builds classes that behave as dataclasses do (they replace them on
`run`'s path, where importing ``dataclasses`` would cost ~10 ms)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from tasklock_cli.util import records


def _pair(frozen: bool):
    def body():
        class Point:
            """A point."""

            x: int
            y: int = 2
            tags: list = dataclasses.field(default_factory=list)

        return Point

    def ours():
        class Point:
            """A point."""

            x: int
            y: int = 2
            tags: list = records.field(default_factory=list)

        return Point

    return dataclasses.dataclass(frozen=frozen)(body()), records.dataclass(frozen=frozen)(ours())


@pytest.mark.parametrize("frozen", [True, False])
def test_same_behaviour_as_a_dataclass(frozen):
    real_cls, our_cls = _pair(frozen)
    real, ours = real_cls(1), our_cls(1)
    shown = "Point(x=1, y=2, tags=[])"
    assert repr(real).rpartition(".")[2] == repr(ours).rpartition(".")[2] == shown
    assert ours == our_cls(1, 2, [])
    assert ours != our_cls(1, 3)
    assert (ours == real) is False  # another class: NotImplemented both ways
    assert our_cls(1).tags is not our_cls(1).tags  # a fresh default each time
    assert our_cls.__match_args__ == real_cls.__match_args__
    assert our_cls.y == real_cls.y == 2
    assert not hasattr(our_cls, "tags") and not hasattr(real_cls, "tags")
    assert (our_cls.__hash__ is None) == (real_cls.__hash__ is None)
    with pytest.raises(TypeError):
        our_cls()
    assert [f.name for f in dataclasses.fields(ours)] == ["x", "y", "tags"]
    assert dataclasses.is_dataclass(ours) and not isinstance(ours, type)  # an instance
    assert dataclasses.replace(ours, y=5) == our_cls(1, 5)
    assert records.replace(ours, y=5) == our_cls(1, 5)
    assert dataclasses.asdict(ours) == dataclasses.asdict(real)


def test_frozen_refuses_assignment_and_hashes_by_value():
    _, our_cls = _pair(True)
    point = our_cls(1, tags=())
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        del point.x
    assert hash(point) == hash(our_cls(1, tags=()))


def test_mutable_assigns_and_does_not_hash():
    _, our_cls = _pair(False)
    point = our_cls(1)
    point.x = 3
    assert point == our_cls(3)
    with pytest.raises(TypeError):
        hash(point)


def test_post_init_runs_after_the_fields():
    seen = []

    @records.dataclass
    class Box:
        size: int

        def __post_init__(self) -> None:
            seen.append(self.size)

    Box(4)
    assert seen == [4]


@pytest.mark.parametrize("frozen", [True, False])
@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((1, 2, [], 4), {}, "takes 4 positional arguments but 5 were given"),
        ((1,), {"x": 2}, "got multiple values for argument 'x'"),
        ((1,), {"z": 2}, "got an unexpected keyword argument 'z'"),
        ((), {"y": 2}, "missing 1 required"),
    ],
)
def test_arguments_are_bound_as_a_dataclass_binds_them(frozen, args, kwargs, error):
    real_cls, our_cls = _pair(frozen)
    with pytest.raises(TypeError):
        real_cls(*args, **kwargs)
    with pytest.raises(TypeError, match=error):
        our_cls(*args, **kwargs)
    assert our_cls(y=3, x=1, tags=[5]) == our_cls(1, 3, [5])


def test_a_field_without_a_default_after_one_with_is_refused_as_by_dataclasses():
    class Bad:
        x: int = 1
        y: int

    with pytest.raises(TypeError, match="non-default argument 'y' follows default argument"):
        records.dataclass(Bad)


def test_no_source_is_compiled_to_build_a_record():
    """The first compile in a process costs ~2 ms (issue 45): records are built without."""
    code = (
        "import sys\n"
        "compiled = []\n"
        "sys.addaudithook(lambda event, args: event == 'compile' and compiled.append(args))\n"
        "from tasklock_cli.util.records import dataclass, field\n"
        "@dataclass(frozen=True)\n"
        "class Point:\n"
        "    x: int\n"
        "    tags: list = field(default_factory=list)\n"
        "assert Point(1) == Point(x=1, tags=[])\n"
        "print(len(compiled))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "0", result.stderr
