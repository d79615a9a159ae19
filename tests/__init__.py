import pytest

# The store contract's cases live in the package (tasklock_cli.testing): their asserts are
# rewritten as the tests' are, which must be registered before anything imports them (this
# package is imported before its conftest).
pytest.register_assert_rewrite("tasklock_cli.testing.contract", "tasklock_cli.testing.helpers")
