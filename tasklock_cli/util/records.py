"""Data classes without the ``dataclasses`` module on `run`'s path.

``import dataclasses`` brings in ``inspect`` (and with it ``ast``, ``dis``, ``tokenize``,
``linecache``): about 10 ms of every `tasklock run`, more than the run's own work on SQLite.
``dataclass`` and ``field`` here take the same arguments (the subset tasklock uses) and give
classes that behave the same: ``__init__`` (made without compiling source), ``__repr__`` and
``__eq__``, a ``__hash__`` when frozen (none when not), assignment refused with
``dataclasses.FrozenInstanceError`` when frozen, ``__match_args__``. ``dataclasses.fields``,
``replace``, ``asdict`` and ``is_dataclass`` keep working on them: ``__dataclass_fields__``
is built (by the real ``dataclasses``, imported then) the first time something asks for it.
"""

from __future__ import annotations


class _Factory:
    """A ``field(default_factory=...)`` until the class is built."""

    __slots__ = ("make",)

    def __init__(self, make) -> None:
        self.make = make


def field(*, default_factory):
    """``dataclasses.field(default_factory=...)``; the only form tasklock uses."""
    return _Factory(default_factory)


def dataclass(cls=None, /, *, frozen: bool = False):
    """``@dataclass`` or ``@dataclass(frozen=True)``."""

    def build(cls):
        return _build(cls, frozen)

    return build if cls is None else build(cls)


def replace(obj, /, **changes):
    """``dataclasses.replace`` for the classes built here."""
    values = {name: getattr(obj, name) for name in type(obj).__match_args__}
    values.update(changes)
    return type(obj)(**values)


def _build(cls, frozen: bool):
    # Not inspect.get_annotations: inspect is what this module keeps off the path.
    names = tuple(cls.__dict__.get("__annotations__", {}))  # noqa: RUF063
    defaults = {name: cls.__dict__[name] for name in names if name in cls.__dict__}
    for name, default in defaults.items():
        if not isinstance(default, _Factory):
            continue
        delattr(cls, name)  # as dataclasses does: no class attribute for a factory field
    own = cls.__dict__
    if "__init__" not in own:
        cls.__init__ = _make_init(cls, names, defaults, frozen)
    if "__repr__" not in own:
        cls.__repr__ = _make_repr(names)
    if "__eq__" not in own:
        cls.__eq__ = _make_eq(names)
        if "__hash__" not in own or own["__hash__"] is None:
            cls.__hash__ = _make_hash(names) if frozen else None
    if frozen:
        cls.__setattr__ = _refuse_assignment
        cls.__delattr__ = _refuse_deletion
    cls.__match_args__ = names
    cls.__dataclass_fields__ = _LazyFields(names, defaults, frozen)
    return cls


def _make_init(cls, names, defaults, frozen: bool):
    """The ``__init__`` a dataclass would have, made without compiling source: the first
    compile in a process sets the compiler up (~2 ms) and each costs ~0.15 ms more, for
    the dozen records a `run` makes. Arguments are bound as Python binds them (``_bind``)."""
    _check_order(cls, names, defaults)
    qualname = f"{cls.__qualname__}.__init__"
    assign = object.__setattr__ if frozen else setattr  # frozen: past _refuse_assignment
    post_init = hasattr(cls, "__post_init__")

    def __init__(self, *args, **kwargs):
        values = _bind(qualname, names, defaults, args, kwargs)
        for name in names:
            assign(self, name, values[name])
        if post_init:
            self.__post_init__()

    __init__.__qualname__ = qualname
    return __init__


def _check_order(cls, names, defaults) -> None:
    """A field without a default after one with a default: the TypeError dataclasses raise."""
    seen_default = False
    for name in names:
        if name in defaults:
            seen_default = True
        elif seen_default:
            raise TypeError(f"non-default argument {name!r} follows default argument")


def _bind(qualname: str, names, defaults, args: tuple, kwargs: dict) -> dict:
    """Each field's value from ``args`` and ``kwargs`` as the parameters ``(self, *names)``
    with ``defaults`` (a factory called for each instance) take them, with Python's errors."""
    if len(args) > len(names):
        given, takes = len(args) + 1, len(names) + 1
        raise TypeError(f"{qualname}() takes {takes} positional arguments but {given} were given")
    values = dict(zip(names, args, strict=False))  # (fewer args than names)
    for name, value in kwargs.items():
        if name in values:
            raise TypeError(f"{qualname}() got multiple values for argument {name!r}")
        if name not in names:
            raise TypeError(f"{qualname}() got an unexpected keyword argument {name!r}")
        values[name] = value
    missing = [name for name in names if name not in values and name not in defaults]
    if missing:
        listed = ", ".join(repr(name) for name in missing)
        raise TypeError(f"{qualname}() missing {len(missing)} required argument(s): {listed}")
    for name, default in defaults.items():
        if name not in values:
            values[name] = default.make() if isinstance(default, _Factory) else default
    return values


def _make_repr(names):
    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__qualname__}({shown})"

    return __repr__


def _make_eq(names):
    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return _values(self, names) == _values(other, names)
        return NotImplemented

    return __eq__


def _make_hash(names):
    def __hash__(self) -> int:
        return hash(_values(self, names))

    return __hash__


def _values(obj, names) -> tuple:
    return tuple(getattr(obj, name) for name in names)


def _refuse_assignment(self, name, value):
    from dataclasses import FrozenInstanceError

    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _refuse_deletion(self, name):
    from dataclasses import FrozenInstanceError

    raise FrozenInstanceError(f"cannot delete field {name!r}")


class _LazyFields:
    """``__dataclass_fields__``, made by the real ``dataclasses`` on first use (from a twin
    class with the same fields), so its ``fields``, ``replace`` and ``asdict`` work here."""

    def __init__(self, names, defaults, frozen: bool) -> None:
        self._spec = (names, defaults, frozen)
        self._fields = None

    def __get__(self, instance, owner):
        if self._fields is None:
            self._fields = self._make(owner)
        return self._fields

    def _make(self, owner):
        import dataclasses

        names, defaults, frozen = self._spec
        namespace: dict[str, object] = {"__annotations__": dict.fromkeys(names, object)}
        for name, default in defaults.items():
            made = isinstance(default, _Factory)
            namespace[name] = dataclasses.field(default_factory=default.make) if made else default
        twin = type(owner.__name__, (), namespace)
        return dataclasses.dataclass(frozen=frozen)(twin).__dataclass_fields__
