"""The shipped docs match the real CLI: completions are current, the man page renders cleanly
and names every option, the README keeps its first commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

import tasklock_cli.cli.app
from tasklock_cli.stores.provisioning import with_query
from tests.support import services

ROOT = Path(__file__).resolve().parent.parent
COMPLETIONS = ROOT / "completions"
MAN_PAGE = ROOT / "man" / "tasklock.1"
README = ROOT / "README.md"
COMPLETION_FILES = ("tasklock.bash", "_tasklock", "tasklock.fish")


def cli_options() -> dict[str, set[str]]:
    """{command name ("" for the global options): every option string it accepts}."""
    group = typer.main.get_command(tasklock_cli.cli.app.app)
    assert isinstance(group, TyperGroup)  # the app has subcommands
    ctx = group.context_class(group, info_name="tasklock", **group.context_settings)
    found = {"": _option_strings(group, ctx)}
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
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


def require_ci_tool(name: str) -> str:
    """A tool .ci/run installs (zsh and fish, whose completions are tested; groff), so CI
    never skips: there a missing one fails."""
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
    long_options = {option for option in cli_options()["list"] if option.startswith("--")}
    assert set(_bash_complete("tasklock list --", tmp_path)) == long_options
    assert _bash_complete("tasklock run job -- cat lo", tmp_path) == ["locks.toml"]


def test_bash_completes_global_options_after_the_command(tmp_path):
    (tmp_path / "locks.toml").write_text("")
    assert _bash_complete("tasklock run job --ttl 5s --sto", tmp_path) == ["--store"]
    assert _bash_complete("tasklock peek k --log-format ", tmp_path) == ["text", "json"]
    assert _bash_complete("tasklock list --config lo", tmp_path) == ["locks.toml"]
    assert _bash_complete("tasklock list -q --log-format json --pre", tmp_path) == ["--prefix"]
    assert _bash_complete("tasklock doctor --store x --verb", tmp_path) == ["--verbose"]
    assert _bash_complete("tasklock run job -v -- cat lo", tmp_path) == ["locks.toml"]


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


def test_fish_completes_global_options_after_the_command(tmp_path):
    (tmp_path / "locks.toml").write_text("")
    assert _fish_complete("tasklock run job --ttl 5s --sto", tmp_path) == ["--store"]
    assert _fish_complete("tasklock peek k --log-format ", tmp_path) == ["json", "text"]
    assert _fish_complete("tasklock list --config lo", tmp_path) == ["locks.toml"]
    assert _fish_complete("tasklock list -q --log-format json --pre", tmp_path) == ["--prefix"]


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
    zsh = require_ci_tool("zsh")
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


def test_completions_take_the_command_after_key_without_double_dash(tmp_path):
    """`run`'s options end at the command: its first word after KEY starts it, "--" or not."""
    (tmp_path / "locks.toml").write_text("")
    assert _bash_complete("tasklock run job --ttl 5s cat lo", tmp_path) == ["locks.toml"]
    assert "cat" in _bash_complete("tasklock run job --ttl 5s ca", tmp_path)
    assert _bash_complete("tasklock run job --ttl ", tmp_path) == []  # a value, not a command
    assert "--renew-every" in _bash_complete("tasklock run job -", tmp_path)
    assert "locks.toml" in _fish_complete("tasklock run job --ttl 5s cat lo", tmp_path)
    assert _fish_complete("tasklock run job --ttl ", tmp_path) == []
    assert _zsh_complete("tasklock run job --ttl 5s cat lo", tmp_path) == ["locks.toml"]
    assert "cat" in _zsh_complete("tasklock run job -- ca", tmp_path)


def test_zsh_completes_commands_and_run_options(tmp_path):
    assert _zsh_complete("tasklock r", tmp_path) == ["run", "release"]
    assert _zsh_complete("tasklock run --t", tmp_path) == ["--ttl"]
    assert _zsh_complete("tasklock --log-format ", tmp_path) == ["text", "json"]


def test_fish_completes_commands_and_run_options(tmp_path):
    require_ci_tool("fish")
    assert sorted(_fish_complete("tasklock r", tmp_path)) == ["release", "run"]
    assert _fish_complete("tasklock run --t", tmp_path) == ["--ttl"]


# -- man page ------------------------------------------------------------------------------


#: The terminal widths the page is checked at: man formats for the terminal's width (or
#: MANWIDTH). A word too long to share a line leaves one that cannot be adjusted ("cannot
#: adjust line"), at some widths and not others: every width from 60 to 100 columns, where
#: that happens most, and wider ones.
MAN_WIDTHS = (*range(60, 101), 120, 160, 200)


def test_man_page_renders_without_warnings():
    """Every warning groff has (-ww), for print and for a terminal of each width: what
    `MANWIDTH=80 man --warnings -l man/tasklock.1` shows, and more. .ci/run installs groff."""
    groff = require_ci_tool("groff")
    warned = {}
    for width in (None, *MAN_WIDTHS):
        terminal = [] if width is None else ["-Tutf8", f"-rLL={width}n", f"-rLT={width}n"]
        result = subprocess.run(
            [groff, "-man", "-ww", "-z", *terminal, str(MAN_PAGE)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if result.returncode != 0 or result.stderr:
            warned[width or "print"] = result.stderr or f"exit {result.returncode}"
    assert warned == {}


#: The font macros, whose arguments troff splits at spaces and quotes.
_FONT_MACRO = re.compile(r"^\.(B|I|BR|RB|BI|IB|IR|RI|SM|SB) ")


def _quotes_troff_drops(line: str) -> list[str]:
    """Where a font macro's arguments lose a double quote meant to be printed: an argument
    that starts with one is quoted up to the next (``"held":`` prints ``held :``), and an
    empty quoted one prints nothing (``store = ""`` prints ``store =``). A literal double
    quote is written ``\\(dq``."""
    args, found, i = line.split(" ", 1)[1], [], 0
    while i < len(args):
        if args[i] != '"':
            end = args.find(" ", i)
            i = len(args) if end < 0 else end + 1
            continue
        end = i + 1
        while end < len(args) and (args[end] != '"' or args[end + 1 : end + 2] == '"'):
            end += 2 if args[end] == '"' else 1
        if end == i + 1:
            found.append("an empty quoted argument")
        if args[end + 1 : end + 2] not in ("", " "):
            found.append(f"a quote closed before {args[end + 1 :]!r}")
        i = end + 1
    return found


def test_man_page_prints_every_double_quote_it_means():
    dropped = {
        number: problems
        for number, line in enumerate(MAN_PAGE.read_text(encoding="utf-8").splitlines(), 1)
        if _FONT_MACRO.match(line) and (problems := _quotes_troff_drops(line))
    }
    assert dropped == {}


def test_man_page_shows_its_json_and_config_samples_as_written():
    """As groff prints them (a font macro's arguments once lost their quotes and spaces)."""
    groff = require_ci_tool("groff")
    result = subprocess.run(
        [groff, "-man", "-Tutf8", "-P-cbou", "-rLL=200n", str(MAN_PAGE)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    text = " ".join(result.stdout.split())
    for sample in (
        'store = ""',
        'ttl = "inf"',
        '{"key": ..., "held": false, "waiters": [...]}',
        '{"removed": N}; with --dry-run, {"would_remove": N}.',
        '{"check", "ok", "detail"}',
    ):
        assert sample in text


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
    options_of = cli_options()
    global_options = options_of[""] - {"-h", "--help"}
    for command, options in options_of.items():
        if not command:
            global_part = text.split(".SH GLOBAL OPTIONS", 1)[1].split(".SH COMMANDS", 1)[0]
            missing = [o for o in options if not _mentions(global_part, o)]
            assert not missing, f"global options missing from GLOBAL OPTIONS: {missing}"
            continue
        assert command in documented, f"no .SS section for the {command!r} command"
        # the global options a command accepts too are documented once, above
        own = options - global_options
        missing = [o for o in own if not _mentions(documented[command], o)]
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
    assert lines[block + 2].startswith("pip install -e '.[test]' && ruff check . && mypy && pytest")
    assert lines[block + 3] == "```"
    assert all(not line.startswith("```") for line in lines[:block])


def test_the_docs_name_the_url_parameters_sqlite_takes():
    """README and man page list each store's URL parameters: SQLite's ``mode=`` too, which
    both once said SQLite did not take while documenting ``?mode=0660``."""
    from tasklock_cli.stores.sqlite.store import URL_PARAMETERS

    for text in (README.read_text(encoding="utf-8"), _man_source_text()):
        flat = " ".join(text.split())
        named = flat[flat.index("on every store: SQLite") :].partition("PostgreSQL")[0]
        assert [f"{name}=" in named for name in URL_PARAMETERS] == [True] * len(URL_PARAMETERS)
        assert "SQLite takes none" not in flat


def test_every_list_of_detected_by_in_the_man_page_is_whole():
    """Where the man page lists the ``detected_by`` values of a loss, it lists them all."""
    from tasklock_cli.errors import LossKind

    text = " ".join(_man_source_text().replace(".BR", "").replace(".B", "").split())
    lists = [
        text[at : at + 400]
        for at in (match.start() for match in re.finditer("detected_by", text))
        if "rejected" in text[at : at + 120]
    ]
    assert len(lists) >= 2  # the ledger's outcomes and the lost event's
    for listed in lists:
        assert [kind for kind in LossKind.ALL if kind not in listed] == [], listed


@pytest.mark.server  # etcd
def test_the_readmes_local_etcd_line_does_what_it_says(cli_env):
    """README's way to try etcd: the member starts on 127.0.0.1:2379 unless told otherwise
    (what ``etcd --help`` says; not started here, where a developer's etcd may hold that
    port), and the run line works against an etcd (the suite's, in its place)."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    member = re.search(r"`etcd (--data-dir \S+) &`", text)
    line = re.search(r"`TASKLOCK_STORE=etcd://127\.0\.0\.1:2379 (tasklock run [^`]+)`", text)
    assert member and line, "README: how to start a local etcd"
    shown = subprocess.run(
        [require_tool("etcd"), "--help"], capture_output=True, text=True, timeout=30
    )
    assert "--listen-client-urls 'http://localhost:2379'" in shown.stdout + shown.stderr
    services.require("etcd")
    url = with_query(
        services.base_url("etcd"), prefix=f"tasklock-docs-{os.getpid()}-{time.monotonic_ns()}/"
    )
    env = {**cli_env, "TASKLOCK_STORE": url}
    try:
        ran = subprocess.run(
            ["sh", "-c", line.group(1)], env=env, capture_output=True, text=True, timeout=60
        )
        assert (ran.returncode, ran.stdout) == (0, "hello\n"), ran.stderr
    finally:
        services.cleanup("etcd", url)


def test_readme_mentions_every_command_and_run_option():
    text = README.read_text(encoding="utf-8")
    for command in cli_options():
        if command:
            assert f"tasklock {command}" in text or f"`{command}`" in text, command
    for option in cli_options()["run"] - {"-h", "--help"}:
        assert _mentions(text, option), option


# -- examples: every fenced block of the README and every example of the man page runs ------
#
# Each example is found by a marker only it contains; a block no check knows fails
# test_every_example_has_a_check, so a new example needs a test. Examples run against a real
# store (SQLite in the test's directory, PostgreSQL for psql); placeholders such as
# ./deploy.sh become stub scripts that record that they ran.


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block."""
    text = README.read_text(encoding="utf-8")
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def _roff_to_text(block: str) -> str:
    for escape, plain in (("\\-", "-"), ("\\e", "\\"), ("\\(aq", "'"), ("\\(dq", '"')):
        block = block.replace(escape, plain)
    return block


def man_examples() -> list[str]:
    """The .nf blocks of EXAMPLES and the config file of FILES, as a reader sees them."""
    text = MAN_PAGE.read_text(encoding="utf-8")
    examples = text.split(".SH EXAMPLES", 1)[1].split(".SH ", 1)[0]
    files = text.split(".SH FILES", 1)[1].split(".SH ", 1)[0]
    blocks = re.findall(r"^\.nf\n(.*?)^\.fi$", examples + files, re.MULTILINE | re.DOTALL)
    return [_roff_to_text(block) for block in blocks]


def all_examples() -> list[str]:
    return [text for _, text in readme_blocks()] + man_examples()


def example(marker: str, source: str = "any") -> list[str]:
    """The examples containing ``marker``, from the README, the man page or both ("any")."""
    candidates = {
        "readme": lambda: [text for _, text in readme_blocks()],
        "man": man_examples,
        "any": all_examples,
    }[source]()
    found = [text for text in candidates if marker in text]
    assert found, f"no example contains {marker!r}"
    return found


# What identifies each example, and the test that runs it.
EXAMPLE_MARKERS = {
    "pip install . && tasklock run demo": "test_install_example_runs",
    "./export-invoices.sh": "test_first_example_runs",
    "*/5 * * * *": "test_cron_examples_run_once_per_schedule",
    "reports:hourly --once-per": "test_once_per_cron_example_runs_once_per_window",
    "# /etc/systemd/system/reports.service": "test_systemd_units",
    "# /etc/systemd/system/reports.timer": "test_systemd_units",
    "kind: CronJob": "test_kubernetes_cronjob",
    "- name: Deploy (one at a time per environment)": "test_ci_examples_run",
    "deploy:\n  stage: deploy": "test_ci_examples_run",
    "tasklock init   # the service is new": "test_fresh_service_ci_recipe",
    'export TASKLOCK_STORE="$LOCK_STORE_URL"': "test_ci_examples_run",
    "exec tasklock run backup:nightly": "test_script_that_locks_itself",
    "--locked-rotate": "test_lock_one_function_reaches_cleanup_when_busy",
    "queue:leader": "test_leader_example_runs",
    "pool:integration --limit 4": "test_semaphore_example_runs_at_most_4_at_once",
    "tasklock: waiting for": "test_waiting_example_matches_real_output",
    "waiting   2, served in this order:": "test_peek_queue_example_matches_real_output",
    "TASKLOCK_FENCING_TOKEN": "test_fencing_examples_against_postgresql",
    '{"event": "error"': "test_json_error_example_matches_real_output",
    "tasklock list --prefix": "test_inspection_examples_run",
    "tasklock peek invoices:nightly --json": "test_inspection_examples_run",
    'store = "postgresql://locks@db.internal/ops"': "test_config_file_examples_are_accepted",
    "completions/tasklock.bash": "test_install_completions_example",
    "tasklock check >/dev/null": "test_check_example_stops_before_the_irreversible_step",
    "textfile_collector/tasklock.prom": "test_prometheus_recipe",
    "alert: NightlyJobNotSucceeded": "test_prometheus_recipe",
    "locks.db?mode=0660": "test_sharing_a_store_recipe",
    '"deploy:production" --replace': "test_replace_example_cancels_the_running_deploy",
    '{"identity": "new-epoch"}': "test_forcing_a_new_epoch_example",
    "db:reporting --shared": "test_readers_and_a_migration_example",
    "app:staging --also db:staging": "test_two_resources_example",
    "deploy:prod --wait 30m --max-waiting 3": "test_priority_and_capped_queue_example",
    '"$HC_URL/start"': "test_healthchecks_recipe",
    "HC_URL=https://hc-ping.com/": "test_healthchecks_recipe",
    "http://pushgateway:9091/metrics/job/tasklock": "test_pushgateway_recipe",
    'locks.lock("invoices:nightly"': "test_api_first_example_runs",
    '"cache:refresh"': "test_api_async_example_runs",
    '@locks.on_one_instance("reports:hourly")': "test_api_decorator_example_runs",
    '"queue:consumer"': "test_api_leader_example_is_followed_when_killed",
    "def test_a_paused_export_loses_its_lock": "test_api_testing_example_passes",
    "TestMyStore = store_contract": "test_api_store_contract_example_collects",
}


def test_every_example_has_a_check():
    for text in all_examples():
        markers = [marker for marker in EXAMPLE_MARKERS if marker in text]
        assert markers, f"an example no test runs:\n{text}"
        assert len({EXAMPLE_MARKERS[m] for m in markers}) == 1, (markers, text)
    assert set(EXAMPLE_MARKERS.values()) <= set(globals())


@pytest.fixture
def shell_env(cli_env, sqlite_url, tmp_path):
    """The environment an example runs in: this checkout's tasklock first on PATH, a fresh
    SQLite store, stubs in the working directory."""
    from tests.support.cli import executable

    bin_dir = str(Path(executable()).parent)
    return {
        **cli_env,
        "PATH": f"{bin_dir}:{cli_env['PATH']}",
        "TASKLOCK_STORE": sqlite_url,
        "HOME": str(tmp_path / "home"),
    }


def stub(path: Path, name: str = "") -> Path:
    """An executable that appends its name and TASKLOCK_FENCING_TOKEN to ran.log."""
    path.write_text(
        f'#!/bin/sh\necho "{name or path.name} $TASKLOCK_FENCING_TOKEN"'
        f' >> "{path.parent}/ran.log"\n'
    )
    path.chmod(0o755)
    return path


def ran(tmp_path: Path) -> list[str]:
    log = tmp_path / "ran.log"
    return log.read_text().splitlines() if log.exists() else []


def sh(script: str, env: dict[str, str], cwd: Path, shell: str = "sh", *args: str):
    return subprocess.run(
        [shell, "-c", script, shell, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_install_example_runs(shell_env, tmp_path):
    (line, test_line) = example("pip install . && tasklock run demo", "readme")[0].splitlines()
    command = line.split("&&", 1)[1].split("#", 1)[0]  # pip install is what .ci/run does
    result = sh(command, shell_env, tmp_path)
    assert result.returncode == 0 and result.stdout == "hello\n", result.stderr
    assert test_line.split("#")[0].split() == [
        "pip", "install", "-e", "'.[test]'", "&&", "ruff", "check", ".", "&&", "mypy", "&&",
        "pytest"
    ]  # fmt: skip


def test_first_example_runs(shell_env, tmp_path):
    stub(tmp_path / "export-invoices.sh")
    result = sh(example("./export-invoices.sh", "readme")[0], shell_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert ran(tmp_path) == ["export-invoices.sh 1"]
    assert result.stdout == "" or "invoices:nightly" not in result.stdout  # released already


def _first_group(pattern: str, text: str) -> str:
    """Group 1 of ``pattern``'s first match in ``text``: the test fails where none is."""
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return match.group(1)


def _cron_command(block: str) -> tuple[str, str]:
    """(schedule, command) of a crontab example, its lines joined as cron needs them."""
    line = block.replace("\\\n", " ").strip().splitlines()[0]
    fields = line.split()
    return " ".join(fields[:5]), " ".join(fields[5:])


def test_cron_examples_run_once_per_schedule(shell_env, tmp_path):
    blocks = example("*/5 * * * *")
    assert len(blocks) == 2  # README and man page
    commands = set()
    for block in blocks:
        schedule, command = _cron_command(block)
        assert schedule == "*/5 * * * *"
        # the key names the schedule, and the hold is shorter than its interval
        assert re.search(r"run (\S+):5min ", command), command
        assert _first_group(r"--hold-at-least (\d+)m ", command) < "5"
        commands.add(re.sub(r"^TASKLOCK_STORE=\S+ ", "", command))
    assert len(commands) == 1, commands  # both say the same
    job = stub(tmp_path / "run.sh")
    command = commands.pop().replace("/opt/reports/run.sh", str(job))
    first = sh(command, shell_env, tmp_path)
    second = sh(command, shell_env, tmp_path)  # another host, within --hold-at-least
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert second.stdout == second.stderr == ""  # cron mails nothing
    assert ran(tmp_path) == ["run.sh 1"]


def test_once_per_cron_example_runs_once_per_window(shell_env, tmp_path):
    blocks = example("reports:hourly --once-per")
    assert len(blocks) == 2  # README and man page
    commands = set()
    for block in blocks:
        schedule, command = _cron_command(block)
        assert schedule == "*/10 * * * *"
        commands.add(re.sub(r"^TASKLOCK_STORE=\S+ ", "", command))
    assert len(commands) == 1, commands  # both say the same
    job = stub(tmp_path / "run.sh")
    command = commands.pop().replace("/opt/reports/run.sh", str(job))
    assert "--once-per 1h" in command
    left_of_the_hour = 3600 - time.time() % 3600
    if left_of_the_hour < 20:  # both runs in one window, however loaded the machine
        time.sleep(left_of_the_hour + 0.05)
    first = sh(command, shell_env, tmp_path)
    second = sh(command, shell_env, tmp_path)  # another host, or a later try this hour
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert second.stdout == second.stderr == ""  # cron mails nothing
    assert ran(tmp_path) == ["run.sh 1"]


def test_systemd_units(shell_env, tmp_path):
    import configparser

    def parse(marker: str) -> configparser.ConfigParser:
        units = configparser.ConfigParser(strict=False, interpolation=None)
        # keep the keys' case, as configparser's docs say; typeshed declares optionxform a method
        units.optionxform = str  # type: ignore[method-assign,assignment]
        units.read_string(example(marker, "readme")[0])
        return units

    service = parse("# /etc/systemd/system/reports.service")["Service"]
    timer = parse("# /etc/systemd/system/reports.timer")
    assert service["KillMode"] == "mixed"
    argv = service["ExecStart"].split()
    grace = parse_seconds(argv[argv.index("--grace") + 1])
    assert parse_seconds(service["TimeoutStopSec"]) > grace
    assert timer["Install"]["WantedBy"] == "timers.target"
    analyze = shutil.which("systemd-analyze")
    if analyze:
        calendar = subprocess.run(
            [analyze, "calendar", timer["Timer"]["OnCalendar"]], capture_output=True, timeout=30
        )
        assert calendar.returncode == 0, calendar.stderr
    job = stub(tmp_path / "run.sh")
    store = service["Environment"].split("=", 1)
    assert store[0] == "TASKLOCK_STORE"
    argv = [a if a != "/opt/reports/run.sh" else str(job) for a in argv]
    assert argv[0] == "/usr/local/bin/tasklock"
    result = sh('exec tasklock "$@"', shell_env, tmp_path, "sh", *argv[1:])
    assert result.returncode == 0, result.stderr
    assert ran(tmp_path) == ["run.sh 1"]


def parse_seconds(text: str) -> float:
    from tasklock_cli.util.durations import parse_duration

    return parse_duration(text)


def _yaml(text: str):
    """The YAML parsed (through yq, when installed) or None."""
    yq = shutil.which("yq")
    if yq is None:
        return None
    import json

    result = subprocess.run([yq, "."], input=text, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_kubernetes_cronjob(shell_env, tmp_path):
    import json

    block = example("kind: CronJob", "readme")[0]
    command = json.loads(_first_group(r"command: (\[.*\])", block))
    parsed = _yaml(block)
    if parsed is not None:
        spec = parsed["spec"]
        assert spec["concurrencyPolicy"] == "Forbid"
        pod = spec["jobTemplate"]["spec"]["template"]["spec"]
        assert pod["containers"][0]["command"] == command
        assert pod["restartPolicy"] == "Never"
        grace_period = pod["terminationGracePeriodSeconds"]
    else:
        grace_period = int(_first_group(r"terminationGracePeriodSeconds: (\d+)", block))
    assert grace_period > parse_seconds(command[command.index("--grace") + 1])
    assert re.search(r'schedule: "\*/15 ', block) and "reports:15min" in command
    job = stub(tmp_path / "run-reports")
    argv = [a if a != "/app/run-reports" else str(job) for a in command]
    assert argv[0] == "tasklock"
    first = sh('exec "$@"', shell_env, tmp_path, "sh", *argv)
    second = sh('exec "$@"', shell_env, tmp_path, "sh", *argv)
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert ran(tmp_path) == ["run-reports 1"]


def _tasklock_lines(block: str) -> list[str]:
    return [
        line.strip().removeprefix("- ").strip()
        for line in block.splitlines()
        if line.strip().removeprefix("- ").startswith("tasklock run")
    ]


def test_ci_examples_run(shell_env, tmp_path):
    stub(tmp_path / "deploy.sh")
    github = example("- name: Deploy (one at a time per environment)", "readme")[0]
    gitlab = example("deploy:\n  stage: deploy", "readme")[0]
    for block in (github, gitlab):
        if (parsed := _yaml(block)) is not None:
            assert parsed  # valid YAML
    env = {
        **shell_env,
        "CI_ENVIRONMENT_NAME": "production",
        "CI_PIPELINE_URL": "https://ci.example/p/1",
        "ENVIRONMENT": "production",
        "LOCK_STORE_URL": shell_env["TASKLOCK_STORE"],
    }
    scripts = (
        [line.replace("${{ github.run_id }}", "4711") for line in _tasklock_lines(github)]
        + _tasklock_lines(gitlab)
        + [example('export TASKLOCK_STORE="$LOCK_STORE_URL"', "man")[0]]
    )
    assert len(scripts) == 3
    for script in scripts:
        result = sh(script, env, tmp_path)
        assert result.returncode == 0, (script, result.stderr)
    assert ran(tmp_path) == ["deploy.sh 1", "deploy.sh 2", "deploy.sh 3"]


def _run_block(block: str) -> str:
    """The shell script of a workflow step's ``run: |`` block (its lines, dedented)."""
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "run: |")
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    body = [line[indent:] for line in lines[start + 1 :] if line.strip()]
    return "\n".join(body) + "\n"


def test_fresh_service_ci_recipe(shell_env, tmp_path):
    """The recipe's step against a Redis started a moment before (a service container):
    after `tasklock init`, the three contending runs go one at a time with tokens 1, 2, 3,
    and none waits out the 32 s a fresh server's quarantine would cost (the bound, 15 s,
    sits between about 2 s and 32 s)."""
    from tests.support.redis_support import private_redis
    from tests.support.redis_support import require_redis_server

    require_redis_server()
    block = example("tasklock init   # the service is new", "readme")[0]
    if (parsed := _yaml(block)) is not None:
        assert parsed["jobs"]["fixtures"]["services"]["redis"]
    script = _run_block(block)
    assert script.startswith("tasklock init") and "tasklock run fixtures:load" in script
    shard = tmp_path / "load-shard.sh"
    shard.write_text(
        '#!/bin/sh\necho "start $1 $TASKLOCK_FENCING_TOKEN" >> "$(dirname "$0")/ran.log"\n'
        'sleep 0.3\necho "end $1" >> "$(dirname "$0")/ran.log"\n'
    )
    shard.chmod(0o755)
    with private_redis() as server:
        env = {**shell_env, "TASKLOCK_STORE": server.url()}
        started = time.monotonic()
        result = sh(script, env, tmp_path)
        took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "marked new" in result.stdout, result.stdout
    log = ran(tmp_path)
    assert len(log) == 6 and all(
        first.startswith("start") and second == f"end {first.split()[1]}"
        for first, second in zip(log[::2], log[1::2], strict=True)
    ), log  # one at a time: each start is followed by its own end
    assert sorted(int(line.split()[2]) for line in log[::2]) == [1, 2, 3]
    assert took < 15, took


def test_replace_example_cancels_the_running_deploy(shell_env, tmp_path, sqlite_url):
    from tests.support.cli import start
    from tests.support.cli import wait_for_holder

    stub(tmp_path / "deploy.sh")
    running = start("run", "deploy:production", "--", "sleep", "300", env=shell_env)
    wait_for_holder(sqlite_url, "deploy:production")
    replace, peek = example('"deploy:production" --replace', "readme")[0].splitlines()
    result = sh(replace, shell_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert running.wait(timeout=30) == 70
    assert ran(tmp_path) == ["deploy.sh 2"]
    assert sh(peek, shell_env, tmp_path).stdout == "deploy:production is free\n"


def test_readers_and_a_migration_example(shell_env, tmp_path, sqlite_url):
    from tasklock_cli.stores import open_store
    from tests.support.cli import start
    from tests.support.cli import wait_until

    readers_line, writer_line = [
        line
        for line in example("db:reporting --shared", "readme")[0].splitlines()
        if line.startswith("tasklock")
    ]
    report = tmp_path / "nightly-report.sh"
    log, go = tmp_path / "log", tmp_path / "go"
    # each reader stays until the test says go: by then all three hold the key together
    report.write_text(
        f'#!/bin/sh\necho "start $$" >> "{log}"\n'
        f'while [ ! -e "{go}" ]; do sleep 0.02; done\necho "end $$" >> "{log}"\n'
    )
    report.chmod(0o755)
    migrate = tmp_path / "migrate.sh"
    migrate.write_text(f'#!/bin/sh\necho "migrate" >> "{log}"\n')
    migrate.chmod(0o755)
    readers = [start(*readers_line.split()[1:], env=shell_env, cwd=tmp_path) for _ in range(3)]
    with open_store(sqlite_url) as store:
        wait_until(lambda: len(store.holders("db:reporting")) == 3, timeout=30)
        writer = start(*writer_line.split()[1:], env=shell_env, cwd=tmp_path)
        wait_until(lambda: len(store.waiters("db:reporting")) == 1, timeout=30)
    go.touch()
    assert writer.wait(timeout=60) == 0
    assert [reader.wait(timeout=60) for reader in readers] == [0, 0, 0]
    log = (tmp_path / "log").read_text().split("\n")
    starts = [n for n, line in enumerate(log) if line.startswith("start")]
    ends = [n for n, line in enumerate(log) if line.startswith("end")]
    migrated = log.index("migrate")
    # the readers overlapped, and the migration ran beside none of them
    assert max(starts) < min(ends)
    assert migrated > max(ends) or migrated < min(starts)


def test_priority_and_capped_queue_example(shell_env, tmp_path, sqlite_url):
    """Two deploys wait, a hotfix (priority 10) comes last and goes first; with three
    waiting, a fourth deploy gives up at once (75)."""
    from tasklock_cli.stores import open_store
    from tests.support.cli import start
    from tests.support.cli import wait_until

    capped, hotfix = [
        line.split()[1:]
        for line in example("deploy:prod --wait 30m --max-waiting 3", "readme")[0].splitlines()
        if line.startswith("tasklock")
    ]
    go = tmp_path / "go"
    (tmp_path / "deploy.sh").write_text(
        f'#!/bin/sh\nwhile [ ! -e "{go}" ]; do sleep 0.02; done\n'
        f'echo "$DEPLOY" >> "{tmp_path}/ran.log"\n'
    )
    (tmp_path / "deploy.sh").chmod(0o755)
    runs = []
    with open_store(sqlite_url) as store:
        for name, args in (("first", capped), ("a", capped), ("b", capped), ("hotfix", hotfix)):
            runs.append(start(*args, env={**shell_env, "DEPLOY": name}, cwd=tmp_path))
            wait_until(lambda: _in_line(store, "deploy:prod") == len(runs), timeout=30)
        late = {**shell_env, "DEPLOY": "late"}
        full = subprocess.run(
            ["tasklock", *capped], env=late, cwd=tmp_path, capture_output=True, text=True
        )
        assert full.returncode == 75, full.stderr
        assert "--max-waiting 3" in full.stderr
        assert [w.priority for w in store.waiters("deploy:prod")] == [10, 0, 0]
    go.touch()
    assert [run.wait(timeout=60) for run in runs] == [0, 0, 0, 0]
    assert ran(tmp_path) == ["first", "hotfix", "a", "b"]


def _in_line(store, key: str) -> int:
    """How many runs hold or wait for ``key``."""
    return len(store.holders(key)) + len(store.waiters(key))


def test_two_resources_example(shell_env, tmp_path):
    deploy = tmp_path / "deploy-with-migration.sh"
    deploy.write_text(f'#!/bin/sh\necho "$TASKLOCK_FENCING_TOKENS" > "{tmp_path}/tokens"\n')
    deploy.chmod(0o755)
    result = sh(example("app:staging --also db:staging", "readme")[0], shell_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "tokens").read_text()) == {"app:staging": 1, "db:staging": 1}


def test_script_that_locks_itself(shell_env, tmp_path):
    script = tmp_path / "backup.sh"
    script.write_text(
        example("exec tasklock run backup:nightly", "readme")[0]
        + 'echo "locked $TASKLOCK_KEY $TASKLOCK_FENCING_TOKEN $*"\n'
    )
    script.chmod(0o755)
    result = subprocess.run(
        [str(script), "a b"], env=shell_env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "locked backup:nightly 1 a b\n"


def test_lock_one_function_reaches_cleanup_when_busy(shell_env, tmp_path, sqlite_url):
    from tests.support.cli import start
    from tests.support.cli import wait_for_holder

    script = tmp_path / "rotate.sh"
    script.write_text(
        example("--locked-rotate", "readme")[0]
        .replace("rotate_keys() { …; }", "rotate_keys() { echo rotated; }")
        .replace("\nprepare\n", "\necho prepared\n")
        .replace("\ncleanup\n", "\necho cleaned up\n")
    )
    script.chmod(0o755)
    free = subprocess.run([str(script)], env=shell_env, capture_output=True, text=True, timeout=60)
    assert (free.returncode, free.stdout) == (0, "prepared\nrotated\ncleaned up\n"), free.stderr
    holder = start("run", "keys:rotate", "--", "sleep", "30", env=shell_env)
    try:
        wait_for_holder(sqlite_url, "keys:rotate")
        busy = subprocess.run(
            [str(script)], env=shell_env, capture_output=True, text=True, timeout=60
        )
    finally:
        holder.terminate()
        holder.wait()
    assert (busy.returncode, busy.stdout) == (75, "prepared\ncleaned up\n"), busy.stderr


def test_leader_example_runs(shell_env, tmp_path):
    stub(tmp_path / "consume-queue")
    result = sh(example("queue:leader", "readme")[0], shell_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert ran(tmp_path) == ["consume-queue 1"]


def test_waiting_example_matches_real_output(shell_env, tmp_path, sqlite_url):
    from tests.support.cli import start
    from tests.support.cli import wait_for_holder

    shown = example("tasklock: waiting for", "readme")[0].splitlines()
    holder = start("run", "deploy:production", "--", "sleep", "30", env=shell_env)
    try:
        info = wait_for_holder(sqlite_url, "deploy:production")
        real = sh("tasklock run deploy:production --wait 1s -- ./deploy.sh", shell_env, tmp_path)
    finally:
        holder.terminate()
        holder.wait()
    assert real.returncode == 75
    who = f"{info.holder.host} pid {info.holder.pid} (user {info.holder.user}, token 1)"
    expected = [
        line.replace("ci-7 pid 4242 (user ci, token 17)", who).replace("waiting 30m", "waiting 1s")
        for line in shown
    ]
    assert real.stderr.splitlines() == expected


def test_peek_queue_example_matches_real_output(shell_env, tmp_path, sqlite_url):
    """The README's `tasklock peek deploy:prod`: the holder's block (elided there), then the
    waiters in the order they will be served, in the example's words."""
    import re

    from tasklock_cli.stores import open_store
    from tests.support.cli import start
    from tests.support.cli import wait_for_holder
    from tests.support.cli import wait_until

    shown = example("waiting   2, served in this order:", "readme")[0].splitlines()
    assert shown[0] == "$ tasklock peek deploy:prod"
    holder = start("run", "deploy:prod", "--", "sleep", "30", env=shell_env)
    runs = []
    try:
        wait_for_holder(sqlite_url, "deploy:prod")
        with open_store(sqlite_url) as store:
            for note in ("commit 5e1f", "commit 77aa"):
                runs.append(
                    start(
                        "run",
                        "deploy:prod",
                        "--wait",
                        "1m",
                        "--note",
                        note,
                        "--",
                        "true",
                        env=shell_env,
                    )
                )
                wait_until(lambda: len(store.waiters("deploy:prod")) == len(runs))
        real = sh("tasklock peek deploy:prod", shell_env, tmp_path).stdout.splitlines()
    finally:
        for process in (holder, *runs):
            process.terminate()
            process.wait()
    assert real[:2] == ["key       deploy:prod", f"holder    {real[1][10:]}"]
    queue = real[real.index("") :]
    assert queue[:2] == shown[shown.index("") :][:2]
    placeholders = re.compile(r"ci-\d pid \d+ \(user ci\)|since \S+ \(\S+ ago\)")
    pattern = r"ci-\d pid \d+ \(user ci\)|since \S+ \(\S+ ago\)"
    for example_line, real_line, run in zip(shown[-2:], queue[-2:], runs, strict=True):
        assert f"pid {run.pid} " in real_line
        assert placeholders.sub("#", example_line) == re.sub(pattern, "#", _generic(real_line))


def _generic(line: str) -> str:
    """A peek line with the host, pid and user of this machine's runs put as the README's."""
    import re

    return re.sub(r"\S+ pid (\d+) \(user [^)]*\)", r"ci-0 pid \1 (user ci)", line)


def test_json_error_example_matches_real_output(shell_env, tmp_path):
    import json

    shown = json.loads(example('{"event": "error"', "readme")[0])
    real = sh(
        "tasklock --log-format json --store redis://127.0.0.1:1/0 peek k", shell_env, tmp_path
    )
    error = json.loads(real.stderr)
    assert real.returncode == shown["code"] == error["code"] == 69
    assert set(error) == set(shown)
    # the same error as the example's, but for a port where nothing listens
    assert error["message"].replace("127.0.0.1:1", "127.0.0.1:6379") == shown["message"]


@pytest.mark.server  # PostgreSQL
def test_fencing_examples_against_postgresql(shell_env, tmp_path):
    services.require("postgres")
    import uuid

    psql = require_tool("psql")
    schema = f"doc_example_{uuid.uuid4().hex[:10]}"
    url = services.base_url("postgres")

    def query(sql: str) -> str:
        result = subprocess.run(
            [psql, url, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-c", sql],
            env={**shell_env, "PGOPTIONS": f"-c search_path={schema}"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    query(f"CREATE SCHEMA {schema}")
    try:
        query(
            "CREATE TABLE invoice_runs (id int PRIMARY KEY, finished_at timestamptz,"
            " fencing_token bigint NOT NULL);"
            "CREATE TABLE jobs (id int PRIMARY KEY, last_run timestamptz,"
            " fencing_token bigint NOT NULL);"
            "INSERT INTO invoice_runs VALUES (42, NULL, 0); INSERT INTO jobs VALUES (7, NULL, 0);"
        )
        # the examples' psql reaches the schema through PGOPTIONS, as a role's search_path would
        env = {**shell_env, "DATABASE_URL": url, "DB": url, "PGOPTIONS": f"-c search_path={schema}"}
        readme, man = (
            example("TASKLOCK_FENCING_TOKEN", "readme"),
            example("TASKLOCK_FENCING_TOKEN", "man"),
        )
        readme = [block for block in readme if "psql" in block]
        assert len(readme) == len(man) == 1
        for block, table in ((readme[0], "invoice_runs"), (man[0], "jobs")):
            env["TASKLOCK_STORE"] = f"sqlite:///{tmp_path}/{table}.db"  # tokens from 1
            first = sh(block, env, tmp_path)
            assert first.returncode == 0, first.stderr
            assert first.stdout.strip() == "UPDATE 1"
            assert query(f"SELECT fencing_token FROM {table}") == "1"
            query(f"UPDATE {table} SET fencing_token = 1000")  # a newer holder wrote since
            stale = sh(block, env, tmp_path)
            assert stale.returncode == 0, stale.stderr
            assert stale.stdout.strip() == "UPDATE 0"  # the older token changes nothing
            assert query(f"SELECT fencing_token FROM {table}") == "1000"
    finally:
        query(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.server  # PostgreSQL
def test_forcing_a_new_epoch_example(shell_env, tmp_path):
    """README's statement for a table restored by hand: the next run meets a quarantine."""
    services.require("postgres")
    import uuid

    from tests.support import pg
    from tests.support.cli import tasklock

    table = f"doc_epoch_{uuid.uuid4().hex[:10]}"
    url = with_query(services.base_url("postgres"), table=table)
    env = {**shell_env, "TASKLOCK_STORE": url}
    (statement,) = example('{"identity": "new-epoch"}', "readme")
    try:
        assert tasklock("run", "k", "--", "true", env=env).returncode == 0
        with pg.admin_connection(url) as conn:
            conn.execute(statement.replace("tasklock_leases", table))
        held_off = tasklock("run", "k", "--", "true", env=env)
        assert held_off.returncode == 75, held_off.stderr
        assert "primary changed" in held_off.stderr
        doctor = tasklock("doctor", env=env)
        assert "an operator asked for a new epoch" in doctor.stdout, doctor.stdout
    finally:
        pg.drop_namespace(url)


@pytest.mark.slow  # (a dozen commands with held leases)
def test_inspection_examples_run(shell_env, tmp_path):
    lines = [
        line.split("  #", 1)[0].strip()
        for block in example("tasklock list --prefix", "readme")
        + example("tasklock peek invoices:nightly --json", "man")
        for line in block.splitlines()
    ]
    assert sh("tasklock run invoices:nightly --hold-at-least 1m -- true", shell_env, tmp_path)
    expected_codes = {
        "tasklock peek invoices:nightly": 0,
        "tasklock peek invoices:nightly --json": 0,
        "tasklock peek deploy:prod": 1,  # free: nobody holds or waits for it here
    }
    for line in lines:
        if line.endswith("--watch"):
            line = f"timeout --preserve-status -s INT 3 {line}"  # (slow starts under load)
        line = line.replace("run …", "run demo -- true")
        result = sh(line, shell_env, tmp_path)
        assert result.returncode == expected_codes.get(line, 0), (line, result.stderr)
        if line.startswith("tasklock release"):  # it broke the lease the peeks saw
            expected_codes = {k: 1 for k in expected_codes}


def test_config_file_examples_are_accepted(shell_env, tmp_path):
    blocks = example('store = "postgresql://locks@db.internal/ops"')
    assert len(blocks) == 2
    for number, block in enumerate(blocks):
        config = tmp_path / f"example-{number}.toml"
        config.write_text(
            block.replace(
                'store = "postgresql://locks@db.internal/ops"',
                f'store = "{shell_env["TASKLOCK_STORE"]}"',
            )
        )
        env = {k: v for k, v in shell_env.items() if k != "TASKLOCK_STORE"}
        result = sh(f"tasklock --config {config} run invoices:x -- true", env, tmp_path)
        assert result.returncode == 0, result.stderr


def test_install_completions_example(shell_env, tmp_path):
    block = example("completions/tasklock.bash", "readme")[0]
    require_tool("man")
    env = {**shell_env, "MANPAGER": "cat", "PAGER": "cat", "MANWIDTH": "80"}
    result = sh(block, env, ROOT)
    assert result.returncode == 0, result.stderr
    home = Path(shell_env["HOME"])
    installed = [
        home / ".local/share/bash-completion/completions/tasklock",
        home / ".zfunc/_tasklock",
        home / ".config/fish/completions/tasklock.fish",
        home / ".local/share/man/man1/tasklock.1",
    ]
    assert all(path.is_file() for path in installed), installed
    assert "tasklock" in result.stdout  # the page, read in place


def test_check_example_stops_before_the_irreversible_step(shell_env, tmp_path):
    (block,) = example("tasklock check >/dev/null", "readme")
    stub(tmp_path / "prepare-batch.sh")
    stub(tmp_path / "send-batch.sh")
    result = sh(block, shell_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert ran(tmp_path) == ["prepare-batch.sh 1", "send-batch.sh 1"]
    # the lease broken while preparing: the batch is not sent (the holder stops the tree)
    (tmp_path / "prepare-batch.sh").write_text(
        "#!/bin/sh\ntasklock release payments:settle --force >/dev/null\n"
    )
    result = sh(block, shell_env, tmp_path)
    assert result.returncode == 70, result.stderr
    assert ran(tmp_path) == ["prepare-batch.sh 1", "send-batch.sh 1"]


def test_prometheus_recipe(shell_env, tmp_path):
    from tests.test_cli_metrics import parse_exposition

    (cron,) = example("textfile_collector/tasklock.prom", "readme")
    schedule, command = _cron_command(cron)
    assert schedule == "* * * * *"
    collector = tmp_path / "textfile_collector"
    collector.mkdir()
    command = command.replace("/var/lib/node_exporter/textfile_collector", str(collector))
    assert sh("tasklock run invoices:nightly -- true", shell_env, tmp_path).returncode == 0
    result = sh(command, shell_env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert [path.name for path in collector.iterdir()] == ["tasklock.prom"]
    _, _, samples = parse_exposition((collector / "tasklock.prom").read_text())
    success = ("tasklock_last_success_timestamp_seconds", (("key", "invoices:nightly"),))
    assert success in samples

    (rule,) = example("alert: NightlyJobNotSucceeded", "readme")
    expr = _first_group(r"expr: (.*)", rule)
    assert expr == (
        'time() - tasklock_last_success_timestamp_seconds{key="invoices:nightly"} > 26 * 3600'
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory of another group needs root")
def test_sharing_a_store_recipe(shell_env, tmp_path):
    """The recipe, with the group "users" and a directory of the test's: the store and the
    entries tasklock makes beside it are the group's to write, under umask 022."""
    (recipe,) = example("locks.db?mode=0660", "readme")
    shared = tmp_path / "shared"
    script = recipe.replace("deployers", "users").replace("/var/lib/tasklock", str(shared))
    stub(tmp_path / "deploy.sh")
    env = {k: v for k, v in shell_env.items() if k != "TASKLOCK_STORE"}
    result = sh(f"umask 022\n{script}", env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ran.log").read_text().split()[0] == "deploy.sh"
    assert stat.S_IMODE(shared.stat().st_mode) == 0o2770 and shared.stat().st_gid == 100
    db = shared / "locks.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o660 and db.stat().st_gid == 100


@pytest.mark.slow
def test_semaphore_example_runs_at_most_4_at_once(shell_env, tmp_path):
    """Six copies of the pool example at once: four run together, each with its own
    slot's database, and the other two wait for free slots."""
    job = tmp_path / "run-integration-tests.sh"
    job.write_text(
        "#!/bin/sh\n"
        f'echo "start $2" >> "{tmp_path}/pool.log"\n'
        "sleep 3\n"
        f'echo "end $2" >> "{tmp_path}/pool.log"\n'
    )
    job.chmod(0o755)
    for block in example("pool:integration --limit 4"):
        (tmp_path / "pool.log").unlink(missing_ok=True)
        runs = [
            subprocess.Popen(["sh", "-c", block], env=shell_env, cwd=tmp_path) for _ in range(6)
        ]
        assert [run.wait(timeout=60) for run in runs] == [0] * 6
        running: set[str] = set()
        most = 0
        for line in (tmp_path / "pool.log").read_text().splitlines():
            what, database = line.split()
            if what == "start":
                assert database not in running, "two jobs on one slot's database at once"
                running.add(database)
                most = max(most, len(running))
            else:
                running.remove(database)
        assert most == 4
        assert running == set()


class _Recorder:
    """A local HTTP server that answers 200 to everything and records each request:
    (method, path, body)."""

    def __enter__(self) -> _Recorder:
        import threading
        from http.server import BaseHTTPRequestHandler
        from http.server import ThreadingHTTPServer

        seen: list[tuple[str, str, str]] = []
        self.requests = seen

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                seen.append((self.command, self.path, body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

            do_GET = do_POST = do_HEAD = do_PUT = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_healthchecks_recipe(shell_env, tmp_path):
    """The config file's hooks ping start and success, start and fail, and a skipped run
    as a log entry, on the cron line's check."""
    from tests.support.cli import start
    from tests.support.cli import wait_until

    require_tool("curl")
    (config,) = example('"$HC_URL/start"', "readme")
    (cron,) = example("HC_URL=https://hc-ping.com/", "readme")
    _, command = _cron_command(cron)
    (tmp_path / "tasklock.toml").write_text(config)
    job = tmp_path / "backup.sh"
    env = {**shell_env, "TASKLOCK_CONFIG": str(tmp_path / "tasklock.toml")}
    with _Recorder() as hc:
        command = command.replace("https://hc-ping.com/your-check-uuid", f"{hc.url}/c1")
        command = command.replace("/usr/local/bin/backup.sh", str(job))
        for code in (0, 1):
            job.write_text(f"#!/bin/sh\nexit {code}\n")
            job.chmod(0o755)
            assert sh(command, env, tmp_path).returncode == code
        holder = start("run", "backup:nightly", "--", "sleep", "30", env=env)
        from tests.support.cli import peek

        wait_until(lambda: peek(env["TASKLOCK_STORE"], "backup:nightly"), timeout=20)
        assert sh(command, env, tmp_path).returncode == 75
        holder.kill()
        holder.wait()
        assert hc.requests == [
            ("GET", "/c1/start", ""),
            ("GET", "/c1", ""),
            ("GET", "/c1/start", ""),
            ("GET", "/c1/fail", ""),
            ("POST", "/c1/log", "skipped: backup:nightly is held"),
        ]


def test_pushgateway_recipe(shell_env, tmp_path):
    require_tool("curl")
    (block,) = example("http://pushgateway:9091/metrics/job/tasklock", "readme")
    report = tmp_path / "daily-report.sh"
    report.write_text("#!/bin/sh\nsleep 0.2\n")
    report.chmod(0o755)
    with _Recorder() as gateway:
        result = sh(block.replace("http://pushgateway:9091", gateway.url), shell_env, tmp_path)
        assert result.returncode == 0, result.stderr
        ((method, path, body),) = gateway.requests
    assert (method, path) == ("POST", "/metrics/job/tasklock/key/reports:daily")
    success, duration = body.splitlines()
    assert re.fullmatch(r"job_last_success_timestamp_seconds \d+", success)
    assert abs(int(success.split()[1]) - time.time()) < 60
    assert 0.2 <= float(duration.split()[1]) < 30


# -- the Python API ------------------------------------------------------------------------


def python_example(marker: str, tmp_path: Path, name: str = "example.py") -> Path:
    """The README's Python example containing ``marker``, written to ``tmp_path/name``."""
    (text,) = example(marker, "readme")
    path = tmp_path / name
    path.write_text(text)
    return path


def run_python(path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args, str(path)],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_api_first_example_runs(shell_env, tmp_path, sqlite_url):
    from tests.support.cli import start
    from tests.support.cli import wait_for_holder

    path = python_example('locks.lock("invoices:nightly"', tmp_path)
    result = run_python(path, shell_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"exporting batch {n} with fencing token 1" for n in range(3)
    ]
    holder = start("run", "invoices:nightly", "--", "sleep", "30", env=shell_env)
    try:
        wait_for_holder(sqlite_url, "invoices:nightly")
        held = run_python(path, shell_env)
    finally:
        holder.terminate()
        holder.wait()
    assert held.returncode == 0, held.stderr
    assert held.stdout.startswith("not exporting: 'invoices:nightly' is held by")
    runs = json.loads(sh("tasklock history invoices:nightly --json", shell_env, tmp_path).stdout)
    assert [(run["command"], run["note"]) for run in runs][-1] == (
        ["python"],
        "from the scheduler",
    )


def test_api_async_example_runs(shell_env, tmp_path):
    result = run_python(python_example('"cache:refresh"', tmp_path), shell_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "refreshing with token 1\n"


def test_api_decorator_example_runs(shell_env, tmp_path):
    path = python_example('@locks.on_one_instance("reports:hourly")', tmp_path)
    result = run_python(path, shell_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["report sent", "rotating", "True 42"]
    runs = json.loads(sh("tasklock history reports:hourly --json", shell_env, tmp_path).stdout)
    assert runs[0]["command"] == ["__main__.hourly_report"]


@pytest.mark.slow  # (waits out the leader's lease)
def test_api_leader_example_is_followed_when_killed(shell_env, tmp_path):
    import signal

    path = python_example('"queue:consumer"', tmp_path)
    env = {**shell_env, "PYTHONPATH": str(ROOT)}

    def leader() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(path)], env=env, stdout=subprocess.PIPE, text=True
        )

    leaders = [leader()]
    try:
        first = leaders[0].stdout.readline() if leaders[0].stdout else ""
        assert first == "leading, term 1\n"
        leaders.append(leader())  # (once the first leads: else either may)
        time.sleep(1.0)  # the second one waits
        killed = time.monotonic()
        leaders[0].send_signal(signal.SIGKILL)
        second = leaders[1].stdout.readline() if leaders[1].stdout else ""
        assert second == "leading, term 2\n"
        assert time.monotonic() - killed < 10 + 5
    finally:
        for each in leaders:
            each.kill()
            each.wait()


@pytest.mark.slow  # (a pytest run of its own)
def test_api_testing_example_passes(shell_env, tmp_path):
    path = python_example("def test_a_paused_export_loses_its_lock", tmp_path, "test_export.py")
    result = run_python(path, shell_env, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


@pytest.mark.slow  # (a pytest run of its own)
def test_api_store_contract_example_collects(shell_env, tmp_path):
    path = python_example("TestMyStore = store_contract", tmp_path, "test_my_store.py")
    result = run_python(
        path, shell_env, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "-x"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b1\d\d passed", result.stdout), result.stdout
