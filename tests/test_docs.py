"""The shipped docs match the real CLI: completions are current, the man page renders cleanly
and names every option, the README keeps its first commands."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

import tasklock_cli.cli
from tests.support import services

ROOT = Path(__file__).resolve().parent.parent
COMPLETIONS = ROOT / "completions"
MAN_PAGE = ROOT / "man" / "tasklock.1"
README = ROOT / "README.md"
COMPLETION_FILES = ("tasklock.bash", "_tasklock", "tasklock.fish")


def cli_options() -> dict[str, set[str]]:
    """{command name ("" for the global options): every option string it accepts}."""
    group = typer.main.get_command(tasklock_cli.cli.app)
    ctx = group.context_class(group, info_name="tasklock", **group.context_settings)
    found = {"": _option_strings(group, ctx)}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        sub = command.context_class(command, info_name=name, parent=ctx, **command.context_settings)
        found[name] = _option_strings(command, sub)
    return found


def _option_strings(command, ctx) -> set[str]:
    return {
        opt
        for param in command.get_params(ctx)
        if param.param_type_name == "option"
        for opt in (*param.opts, *param.secondary_opts)
    }


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install {name})")
    return path


def require_shell(name: str) -> str:
    """A shell whose completions are tested: .ci/run installs it, so CI never skips."""
    path = shutil.which(name)
    if path is None:
        if services.in_ci():
            pytest.fail(f"CI=true but {name} is not installed (.ci/run installs it)")
        pytest.skip(f"{name} is not installed (apt-get install {name})")
    return path


# -- completions ---------------------------------------------------------------------------


def test_committed_completions_are_generated_from_the_current_cli(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_completions.py"), "--output-dir", tmp_path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    for name in COMPLETION_FILES:
        fresh = (tmp_path / name).read_bytes()
        committed = (COMPLETIONS / name).read_bytes() if (COMPLETIONS / name).exists() else b""
        assert committed == fresh, (
            f"completions/{name} is out of date with the CLI: "
            "run .venv/bin/python scripts/gen_completions.py"
        )


def test_completions_name_every_command_and_option():
    options = cli_options()
    for name in COMPLETION_FILES:
        text = (COMPLETIONS / name).read_text(encoding="utf-8")
        for command, opts in options.items():
            assert not command or re.search(rf"\b{command}\b", text), (name, command)
            for opt in opts:
                # fish spells --ttl as "-l ttl" and -v as "-s v"
                spelled = opt if name != "tasklock.fish" else opt.lstrip("-")
                assert spelled in text, (name, command, opt)


@pytest.mark.parametrize(
    ("shell", "script"),
    [("bash", "tasklock.bash"), ("zsh", "_tasklock"), ("fish", "tasklock.fish")],
)
def test_completion_script_syntax(shell, script):
    executable = require_tool(shell)
    result = subprocess.run(
        [executable, "-n", str(COMPLETIONS / script)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def _bash_complete(line: str, cwd: Path) -> list[str]:
    harness = (
        'source "$1"; read -ra COMP_WORDS <<< "$2"; [[ $2 == *" " ]] && COMP_WORDS+=("");'
        " COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _tasklock; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    result = subprocess.run(
        [
            require_tool("bash"),
            "--norc",
            "-c",
            harness,
            "bash",
            COMPLETIONS / "tasklock.bash",
            line,
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return [word for word in result.stdout.splitlines() if word]


def test_bash_completes_commands_options_and_values(tmp_path):
    (tmp_path / "locks.toml").write_text("")
    assert set(_bash_complete("tasklock ", tmp_path)) == set(cli_options()) - {""}
    assert _bash_complete("tasklock r", tmp_path) == ["run", "release"]
    assert _bash_complete("tasklock --log-format ", tmp_path) == ["text", "json"]
    assert _bash_complete("tasklock --config lo", tmp_path) == ["locks.toml"]
    assert _bash_complete("tasklock --store x --log-format json pe", tmp_path) == ["peek"]
    assert _bash_complete("tasklock run job --ttl 5s --hold", tmp_path) == ["--hold-at-least"]
    assert _bash_complete("tasklock run job --ttl ", tmp_path) == []  # a duration, not files
    assert set(_bash_complete("tasklock list --", tmp_path)) == cli_options()["list"] - {"-h"}
    assert _bash_complete("tasklock run job -- cat lo", tmp_path) == ["locks.toml"]


def _fish_complete(line: str, cwd: Path) -> list[str]:
    script = f"source {COMPLETIONS / 'tasklock.fish'}; complete -C {line!r}"
    result = subprocess.run(
        [require_tool("fish"), "--no-config", "-c", script],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return [entry.split("\t")[0] for entry in result.stdout.splitlines()]


def test_fish_completes_commands_options_and_values(tmp_path):
    (tmp_path / "locks.toml").write_text("")
    assert set(_fish_complete("tasklock ", tmp_path)) == set(cli_options()) - {""}
    assert _fish_complete("tasklock --log-format ", tmp_path) == ["json", "text"]
    assert _fish_complete("tasklock --config lo", tmp_path) == ["locks.toml"]
    assert _fish_complete("tasklock run job --ttl 5s --hold", tmp_path) == ["--hold-at-least"]
    assert _fish_complete("tasklock run job --ttl ", tmp_path) == []
    assert "--" in _fish_complete("tasklock run job -", tmp_path)
    assert "locks.toml" in _fish_complete("tasklock run job -- cat lo", tmp_path)


# zsh completes only inside its line editor: an interactive zsh under zpty gets the line and a
# TAB; compadd is wrapped to print each candidate, between two NUL lines.
_ZSH_CAPTURE = r"""
PROMPT=
autoload -U compinit
compinit -u -d "$CAPTURE_DIR/.zcompdump"
bindkey '^I' complete-word
null-line () { echo -E - $'\0' }
compprefuncs=( null-line )
comppostfuncs=( null-line exit )
zstyle ':completion:*' insert-tab false
compadd () {
    if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then
        builtin compadd "$@"
        return $?
    fi
    typeset -a __hits
    builtin compadd -A __hits "$@"
    local hit
    for hit in $__hits; do echo -E - "$hit"; done
}
"""
_ZSH_DRIVER = r"""
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "fpath=(${(q)1} \$fpath); CAPTURE_DIR=${(q)2}; source ${(q)2}/capture.zsh"
zpty -w -n z "$3"$'\t'
local line
while zpty -r z line; do print -rn -- "$line"; done
"""


def _zsh_complete(line: str, work: Path) -> list[str]:
    zsh = require_shell("zsh")
    (work / "capture.zsh").write_text(_ZSH_CAPTURE)
    result = subprocess.run(
        [zsh, "-f", "-c", _ZSH_DRIVER, "zsh", str(COMPLETIONS), str(work), line],
        capture_output=True,
        timeout=30,
        cwd=work,
    )
    assert result.returncode == 0, result.stderr
    parts = result.stdout.split(b"\0")
    assert len(parts) >= 3, result.stdout  # the completion system ran: both NUL lines came
    return [
        word.strip() for word in parts[1].decode().replace("\r", "").split("\n") if word.strip()
    ]


def test_zsh_completes_commands_and_run_options(tmp_path):
    assert _zsh_complete("tasklock r", tmp_path) == ["run", "release"]
    assert _zsh_complete("tasklock run --t", tmp_path) == ["--ttl"]
    assert _zsh_complete("tasklock --log-format ", tmp_path) == ["text", "json"]


def test_fish_completes_commands_and_run_options(tmp_path):
    require_shell("fish")
    assert sorted(_fish_complete("tasklock r", tmp_path)) == ["release", "run"]
    assert _fish_complete("tasklock run --t", tmp_path) == ["--ttl"]


# -- man page ------------------------------------------------------------------------------


def test_man_page_renders_without_warnings():
    groff = require_tool("groff")
    result = subprocess.run(
        [groff, "-man", "-ww", "-z", str(MAN_PAGE)], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def _man_source_text() -> str:
    """The page's source with the roff escapes that appear around option names undone."""
    text = MAN_PAGE.read_text(encoding="utf-8")
    text = re.sub(r"\\f[BIRP]|\\f\[[A-Z]*\]", "", text)
    return text.replace("\\-", "-").replace("\\e", "\\")


def _mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def test_man_page_documents_every_command_and_option():
    text = _man_source_text()
    sections = re.split(r"^\.SS ", text, flags=re.MULTILINE)
    documented = {section.split()[0].strip('"'): section for section in sections[1:]}
    for command, options in cli_options().items():
        if not command:
            global_part = text.split(".SH GLOBAL OPTIONS", 1)[1].split(".SH COMMANDS", 1)[0]
            missing = [o for o in options if not _mentions(global_part, o)]
            assert not missing, f"global options missing from GLOBAL OPTIONS: {missing}"
            continue
        assert command in documented, f"no .SS section for the {command!r} command"
        missing = [o for o in options if not _mentions(documented[command], o)]
        assert not missing, f"options of {command!r} missing from its section: {missing}"


def test_man_page_documents_no_option_the_cli_lacks():
    text = _man_source_text()
    options = cli_options()
    section, command = None, ""
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if line.startswith(".SH "):
            section = line[4:].strip('"')
            command = ""
        elif line.startswith(".SS ") and section == "COMMANDS":
            command = line[4:].strip('"').split()[0]
        elif line == ".TP" and section in ("GLOBAL OPTIONS", "COMMANDS"):
            item = lines[number + 1]
            for option in re.findall(r"(?<![\w-])--?[a-z][\w-]*", item):
                assert option in options[command], (
                    f"man page: {option} is not a {command or 'global'} option"
                )


def test_man_page_has_the_sections_and_exit_codes():
    text = _man_source_text()
    for section in (
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "COMMANDS",
        "DURATIONS",
        "ENVIRONMENT",
        "EXIT STATUS",
        "FILES",
        "STORES",
        "SAFETY",
        "EXAMPLES",
        "SEE ALSO",
    ):
        assert re.search(rf"^\.SH \"?{section}\"?$", text, flags=re.MULTILINE), section
    exit_status = text.split(".SH EXIT STATUS", 1)[1].split(".SH ", 1)[0]
    for code in ("128+", "75", "70", "69", "78", "2", "126", "127"):
        assert code in exit_status, code
    for variable in (
        "TASKLOCK_STORE",
        "TASKLOCK_CONFIG",
        "XDG_STATE_HOME",
        "XDG_CONFIG_HOME",
        "NO_COLOR",
        "TASKLOCK_KEY",
        "TASKLOCK_FENCING_TOKEN",
        "TASKLOCK_LEASE_EXPIRES_AT",
    ):
        assert f".B {variable}" in text, variable
    assert ".BR flock (1)" in text


# -- README --------------------------------------------------------------------------------


def test_readme_starts_with_the_install_and_test_commands():
    lines = README.read_text(encoding="utf-8").splitlines()
    block = lines.index("```sh")
    assert lines[block + 1].startswith("pip install . && tasklock run demo -- echo hello")
    assert lines[block + 2].startswith("pip install -e '.[test]' && ruff check . && pytest")
    assert lines[block + 3] == "```"
    assert all(not line.startswith("```") for line in lines[:block])


def test_readme_mentions_every_command_and_run_option():
    text = README.read_text(encoding="utf-8")
    for command in cli_options():
        if command:
            assert f"tasklock {command}" in text or f"`{command}`" in text, command
    for option in cli_options()["run"] - {"-h", "--help"}:
        assert _mentions(text, option), option
