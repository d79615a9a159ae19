"""setuptools commands of this repository's build (``[tool.setuptools.cmdclass]`` in
pyproject.toml): an editable install that installs the man page, as a regular one does.

setuptools builds an editable wheel with its ``data_files`` left out: its ``editable_wheel``
asks the distribution ``has_data()``, a method distributions do not have (theirs is
``has_data_files()``), so it never runs ``install_data``. Without this, ``pip install -e .``
after ``pip install .`` would uninstall the man page (share/man/man1/tasklock.1) that the
regular install put in place, and install none (issue 41).
"""

from __future__ import annotations

from setuptools.command.editable_wheel import editable_wheel


class EditableWheel(editable_wheel):
    """``editable_wheel`` that also puts the ``data_files`` in the wheel (its ``.data/data``),
    so that pip installs them into the environment beside the editable package."""

    def _run_install(self, category: str) -> None:
        """Install the category into the wheel; ``data`` by ``has_data_files()``, the
        distribution's real method, where setuptools asks for ``has_data()``."""
        if category == "data":
            if self.distribution.has_data_files():
                self.run_command("install_data")
            return
        super()._run_install(category)
