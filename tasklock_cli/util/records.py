"""Data classes without the ``dataclasses`` module on `run`'s path.

``import dataclasses`` brings in ``inspect`` (and with it ``ast``, ``dis``, ``tokenize``,
``linecache``): about 10 ms of every `tasklock run`, more than the run's own work on SQLite.
``dataclass`` and ``field`` here take the same arguments (the subset tasklock uses) and give
classes that behave the same: the generated ``__init__``, ``__repr__`` and ``__eq__``, a
``__hash__`` when frozen (none when not), assignment refused with
``dataclasses.FrozenInstanceError`` when frozen, ``__match_args__``. ``dataclasses.fields``,
``replace``, ``asdict`` and ``is_dataclass`` keep working on them: ``__dataclass_fields__``
is built (by the real ``dataclasses``, imported then) the first time something asks for it.
"""

from __future__ import annotations

_MISSING = object()


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
    params, lines = [], []
    scope: dict[str, object] = {"_set": object.__setattr__}
    for name in names:
        default = defaults.get(name, _MISSING)
        if isinstance(default, _Factory):
            scope[f"_make_{name}"] = default.make
            params.append(f"{name}=_MISSING")
            value = f"_make_{name}() if {name} is _MISSING else {name}"
        else:
            if default is not _MISSING:
                scope[f"_default_{name}"] = default
                params.append(f"{name}=_default_{name}")
            else:
                params.append(name)
            value = name
        assign = f"_set(self, {name!r}, {value})" if frozen else f"self.{name} = {value}"
        lines.append(f"    {assign}")
    scope["_MISSING"] = _MISSING
    body = "\n".join(lines) or "    pass"
    source = f"def __init__(self, {', '.join(params)}):\n{body}\n"
    exec(source, scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    if hasattr(cls, "__post_init__"):
        plain_init = init

        def init(self, *args, **kwargs):
            plain_init(self, *args, **kwargs)
            self.__post_init__()

    return init


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
