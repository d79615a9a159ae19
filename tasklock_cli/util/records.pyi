# What the type checker sees of records.py: the standard dataclasses, whose behaviour
# records.py gives without importing them (see its docstring).
from dataclasses import dataclass as dataclass
from dataclasses import field as field
from dataclasses import replace as replace
