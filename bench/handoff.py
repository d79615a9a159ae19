"""Section 3: hand-off latency, from one holder's child exiting to the next waiter's child
starting, all through the CLI."""

from __future__ import annotations

import itertools
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.builds import BEFORE_GUARD
from bench.builds import KNOWN_BASELINES
from bench.builds import Build
from bench.builds import current_build
from bench.builds import neutral_cwd
from bench.builds import prove
from bench.etcd_member import Gateway
from bench.etcd_member import b64
from bench.etcd_member import etcdctl_prefix
from bench.etcd_member import prefix_end
from bench.harness import TASKLOCK
from bench.harness import Budget
from bench.harness import Envs
from bench.harness import Table
from bench.harness import fmt
from bench.harness import median
from bench.harness import p99
from bench.harness import prose
from bench.harness import reap
from bench.harness import spawn
from bench.harness import wait_until
from bench.harness import with_store
from bench.overhead import etcdctl_lock
from bench.stores import StoreKind

#: The reference peer's row: two or more `etcdctl lock K -- CMD` clients taking turns.
ETCDCTL_ROW = "etcdctl lock (etcd)"
#: tasklock on SQLite as it was before the guard process: a regular install of BEFORE_GUARD.
BEFORE_GUARD_ROW = f"sqlite, {BEFORE_GUARD} ({KNOWN_BASELINES[BEFORE_GUARD]})"
#: Issue 25's targets: a row's p50 over its baseline's, measured in the same rounds.
#: Runs of these in a contender's name become one dash in its round's tag (a file name, a key).
NOT_A_WORD = re.compile(r"\W+")
BASELINES = {"sqlite": (BEFORE_GUARD_ROW, 1.1), "etcd": (ETCDCTL_ROW, 2.0)}

HOLDER_SCRIPT = (
    'echo "s $EPOCHREALTIME" >> "$BENCH_LOG"; '
    'while [ ! -e "$BENCH_GO" ]; do sleep 0.005; done; echo "e $EPOCHREALTIME" >> "$BENCH_LOG"'
)


WAITER_SCRIPT = (
    'echo "s $EPOCHREALTIME" >> "$BENCH_LOG"; sleep 0.02; echo "e $EPOCHREALTIME" >> "$BENCH_LOG"'
)


def read_events(log: Path) -> list[tuple[float, str]]:
    if not log.exists():
        return []
    events = []
    for line in log.read_text().splitlines():
        kind, _, stamp = line.partition(" ")
        events.append((float(stamp), kind))
    return sorted(events)


@dataclass
class Contender:
    """What takes turns on the lock: tasklock on a store, or `etcdctl lock` on the member."""

    name: str
    kind: StoreKind
    etcdctl: bool = False
    build: Build | None = None  # the tasklock install whose `tasklock` runs (not etcdctl)

    def argv(self, env: dict[str, str], tag: str) -> tuple[list[str], dict[str, str]]:
        """The command line before the child's `bash -c SCRIPT`, and its environment."""
        if self.etcdctl:
            lock = f"{etcdctl_prefix('handoff-etcdctl')}hot-{tag}"
            return etcdctl_lock(self.kind, [lock, "--", "bash", "-c"]), {
                **env,
                "ETCDCTL_API": "3",
            }
        assert self.build is not None
        run = ["run", f"hot-{tag}", "--wait", "inf", "--", "bash", "-c"]
        # A baseline gets a file of its own: the schema may differ.
        name = "handoff" if self.build.name == "now" else f"handoff-{self.build.name}"
        return [self.build.tasklock, *run], with_store(env, self.kind.url(name))

    def all_waiting(self, errs: list[Path], tag: str) -> bool:
        """tasklock: every waiter printed its `waiting` event; etcdctl (which prints nothing):
        the holder's and every waiter's key exist under the lock's prefix (each client puts
        its own key, then waits for the keys created before it to go)."""
        if not self.etcdctl:
            return all("waiting" in e.read_text() for e in errs)
        prefix = f"{etcdctl_prefix('handoff-etcdctl')}hot-{tag}/".encode()
        gateway = Gateway(self.kind.member().client_port)
        try:
            found = gateway.post(
                "/v3/kv/range",
                {"key": b64(prefix), "range_end": b64(prefix_end(prefix)), "count_only": True},
            )
        finally:
            gateway.close()
        return int(found.get("count", 0)) >= len(errs) + 1


def handoff_round(
    contender: Contender, env: dict[str, str], waiters: int, tag: str, workdir: Path
) -> tuple[list[float], int]:
    """One holder, then ``waiters`` queued behind it; returns (hand-off latencies, overlaps)."""
    rundir = workdir / f"handoff-{tag}"
    rundir.mkdir()
    log, go = rundir / "log", rundir / "go"
    argv, env = contender.argv(env, tag)
    env = {**env, "BENCH_LOG": str(log), "BENCH_GO": str(go)}
    procs = [spawn([*argv, HOLDER_SCRIPT], env)]
    try:
        wait_until(lambda: len(read_events(log)) >= 1, 15, "the holder to start")
        errs = [rundir / f"w{i}.err" for i in range(waiters)]
        for err in errs:
            procs.append(spawn([*argv, WAITER_SCRIPT], env, stderr=err.open("w")))
        wait_until(lambda: contender.all_waiting(errs, tag), 30 + waiters, "waiters")
        time.sleep(0.3)  # let every waiter settle into its steady polling/listening state
        go.touch()
        for proc in procs:
            reap(proc, timeout=20 + waiters)
    finally:
        for proc in procs:
            if proc.poll() is None:
                reap(proc, timeout=0)
    return handoff_latencies(read_events(log))


def run_refused(kind: StoreKind, env: dict[str, str], *options: str) -> str | None:
    """None when `tasklock run K [OPTIONS] --wait 0 -- true` works on this store, else why
    not (its exit code and the last line it printed)."""
    argv = [TASKLOCK, "run", "probe", *options, "--wait", "0", "--", "true"]
    env = with_store(env, kind.url("handoff_probe"))
    done = subprocess.run(
        argv, env=env, cwd=neutral_cwd(), capture_output=True, text=True, timeout=60
    )
    if done.returncode == 0:
        return None
    said = done.stderr.strip().splitlines()
    run = " ".join(["tasklock run", *options])
    return f"`{run}` exits {done.returncode} here: {said[-1] if said else 'no message'}"


def contenders(
    kinds: list[StoreKind], baselines: list[Build], broken: dict[str, str | None]
) -> list[Contender]:
    """Every live store whose `tasklock run` works; right after SQLite each baseline build on
    SQLite, and right after etcd `etcdctl lock` when etcdctl is installed."""
    found = []
    for kind in kinds:
        if kind.reason is None and broken[kind.name] is None:
            found.append(Contender(kind.name, kind, build=current_build()))
            if kind.name == "sqlite":
                found += [Contender(f"sqlite, {b.title}", kind, build=b) for b in baselines]
            if kind.name == "etcd" and shutil.which("etcdctl"):
                found.append(Contender(ETCDCTL_ROW, kind, etcdctl=True))
    return found


def quartiles(ms: list[float]) -> str:
    if not ms:
        return "—"
    ordered = sorted(ms)
    return f"{ordered[len(ordered) // 4]:.2f}–{ordered[(3 * len(ordered)) // 4]:.2f}"


def against_baseline(
    name: str, waiters: int, results: dict[tuple[str, int], tuple[int, list[float], int]]
) -> tuple[str, str, str]:
    """(baseline row, this row's p50 ÷ the baseline's, the target met or missed)."""
    if name not in BASELINES or (BASELINES[name][0], waiters) not in results:
        return "—", "—", ""
    baseline, target = BASELINES[name]
    mine, theirs = results[(name, waiters)][1], results[(baseline, waiters)][1]
    if not mine or not theirs:
        return baseline, "—", ""
    ratio = median(mine) / median(theirs)
    verdict = "met" if ratio <= target else f"missed by {ratio - target:.2f}"
    return baseline, fmt(ratio), f"≤ {target}: {verdict}"


def handoff_latencies(events: list[tuple[float, str]]) -> tuple[list[float], int]:
    kinds = [k for _, k in events]
    overlaps = sum(1 for a, b in itertools.pairwise(kinds) if a == b == "s")
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(events) if a[1] == "e" and b[1] == "s"]
    return gaps, overlaps


def prove_contenders(live: list[Contender], env: dict[str, str]) -> list[str]:
    """Each tasklock contender's command line, run once as its rounds run it (a child of
    `true`), shown to import its build's package (WrongBuild if not)."""
    lines = []
    for who in live:
        if who.build is not None:
            argv, who_env = who.argv(env, "proof")
            lines.append(prove(who.name, [*argv, "true"], who_env, who.build))
            print(f"proof: {lines[-1]}", flush=True)
    return lines


def section_handoff(
    kinds: list[StoreKind], envs: Envs, budget: Budget, workdir: Path, baselines: list[Build]
) -> Table:
    table = Table(
        "3. Hand-off latency (previous holder's child exits → next waiter's child starts)",
        ["store", "waiters", "rounds", "hand-offs", "p50 ms", "p25–p75 ms", "p99 ms", "max ms",
         "overlaps", "baseline", "× baseline p50", "target"],
    )  # fmt: skip
    started = time.monotonic()
    broken = {k.name: run_refused(k, envs.warm) if k.reason is None else None for k in kinds}
    live = contenders(kinds, baselines, broken)
    proven = prove_contenders(live, envs.warm)
    results: dict[tuple[str, int], tuple[int, list[float], int]] = {}
    for waiters, rounds in budget.handoff_rounds.items():
        deadline = time.monotonic() + budget.handoff_seconds
        for r in range(rounds):
            if r and time.monotonic() > deadline:
                break
            for who in live:  # stores (and etcdctl) interleaved round by round
                tag = f"{NOT_A_WORD.sub('-', who.name)}-{waiters}-{r}"
                gaps, overlaps = handoff_round(who, envs.warm, waiters, tag, workdir)
                done, all_gaps, all_overlaps = results.get((who.name, waiters), (0, [], 0))
                results[(who.name, waiters)] = (done + 1, all_gaps + gaps, all_overlaps + overlaps)
    for kind in kinds:
        if (kind.reason or broken[kind.name]) is not None:
            table.skip(kind.name, kind.reason or broken[kind.name] or "")
    if any(k.name == "etcd" and k.reason is None for k in kinds) and not shutil.which("etcdctl"):
        table.skip(ETCDCTL_ROW, "no etcdctl on PATH")
    for who in live:
        for waiters in budget.handoff_rounds:
            done, gaps, overlaps = results[(who.name, waiters)]
            ms = [g * 1000 for g in gaps]
            table.add(
                who.name,
                waiters,
                done,
                len(ms),
                median(ms),
                quartiles(ms),
                p99(ms),
                max(ms) if ms else None,
                overlaps,
                *against_baseline(who.name, waiters, results),
            )
    table.notes += [
        prose(
            """Each round: one `tasklock run hot --wait inf -- bash -c …` holder, then N waiters
                started and confirmed waiting (their `waiting` event), 0.3 s settle, then the
                holder's child exits. Each child appends `s $EPOCHREALTIME` on start, sleeps 20 ms,
                appends `e $EPOCHREALTIME` just before exiting (bash's builtin clock: no fork,
                unlike `date +%s.%N`). Hand-off = next `s` − previous `e`."""
        ),
        prose(
            """It includes the old wrapper noticing its child's exit, the release round trip, the
                waiter waking (SQLite: a byte written to the longest waiter's FIFO; Redis:
                BLPOP on the key's wake list; PostgreSQL: LISTEN/NOTIFY for the first waiter in
                line, the others queued behind it on an advisory lock: one waiter woken per
                release; etcd: a streamed watch, the first waiter on the key's slots, each other
                one on the waiter ahead of it) and spawning the child. `overlaps` counts two
                children running at once (must be 0)."""
        ),
        prose(
            f"""`{ETCDCTL_ROW}`: the reference peer measured the same way in the same rounds
                (interleaved with the stores, right after tasklock on etcd, against the same
                member): holder and waiters are `etcdctl --endpoints=… lock K -- bash -c …`
                with the same scripts. etcdctl prints nothing while it waits, so its waiters
                are confirmed waiting when the holder's and every waiter's key exist under
                `K/` (each etcdctl client puts its own key with its session's lease, then
                watches the key created just before its own). Its hand-off contains etcdctl
                noticing its child's exit, revoking its session lease, the next client's watch
                firing, and spawning the child."""
        ),
        prose(
            f"""`sqlite, <commit> …` rows: tasklock as it was at that commit, on SQLite,
                measured the same way in the same rounds, right after today's SQLite: its own
                regular install (the commit's tree from `git archive`, `pip install`ed in a venv
                of its own) on a database file of its own. Every process runs from an empty
                directory outside the checkout; each contender's command line was first run
                once with `PYTHONVERBOSE=1` and refused unless every `tasklock_cli` it imported
                is its build's (the proof lines below). `× baseline p50` = this row's p50 ÷ its
                baseline's for the same number of waiters; `target` = issue 25's: SQLite ≤ 1.1
                × {BEFORE_GUARD}, etcd ≤ 2 × `etcdctl lock`. `p25–p75`: the spread (nearest
                rank)."""
        ),
        *[f"Proof (`PYTHONVERBOSE=1`, same argv, env and cwd): {line}" for line in proven],
    ]
    table.seconds = time.monotonic() - started
    return table


# -- 3c. hand-off between modes (--shared) ---------------------------------------------------------

#: How long every 3c run may wait: `run K [--shared] --wait 60 -- …`.
MODES_WAIT = "60"
#: Let the waiters settle into their steady waiting state before a holder's child exits.
SETTLE_S = 0.3


@dataclass(frozen=True)
class ModeCase:
    """Holders of one mode, then waiters of a mode queued behind them. The holders' children
    exit one after another: all but the last together, then (once their wrappers are gone)
    the last, so the hand-off starts at a known exit."""

    label: str
    holders: int
    holders_shared: bool
    waiters: int
    waiters_shared: bool


#: The plain exclusive hand-off, every 3c row's reference.
PLAIN = ModeCase("exclusive → exclusive", 1, False, 1, False)


def mode_cases(readers: tuple[int, ...]) -> list[ModeCase]:
    """The plain hand-off, then writer → R readers and R readers → writer for each R."""
    cases = [PLAIN]
    for r in readers:
        cases.append(ModeCase(f"exclusive → {r} shared", 1, False, r, True))
    for r in readers:
        cases.append(ModeCase(f"{r} shared → exclusive", r, True, 1, False))
    return cases


def mode_argv(shared: bool, tag: str) -> list[str]:
    """`tasklock run K [--shared] --wait 60 -- bash -c` (the script follows)."""
    mode = ["--shared"] if shared else []
    return [TASKLOCK, "run", f"modes-{tag}", *mode, "--wait", MODES_WAIT, "--", "bash", "-c"]


def mode_round(
    kind: StoreKind, env: dict[str, str], case: ModeCase, tag: str, workdir: Path
) -> tuple[float, float | None, int]:
    """One round of ``case``: (last holder's `e` → last waiter's `s`, first → last waiter's
    `s` when there are several, waiters that started before a holder's `e`)."""
    rundir = workdir / f"modes-{tag}"
    rundir.mkdir()
    env = with_store(env, kind.url("handoff_modes"))
    early, last = rundir / "go-early", rundir / "go-last"
    held = [rundir / f"h{i}.log" for i in range(case.holders)]
    waited = [rundir / f"w{i}.log" for i in range(case.waiters)]
    errs = [rundir / f"w{i}.err" for i in range(case.waiters)]
    procs = []
    try:
        for i, log in enumerate(held):
            go = last if i == case.holders - 1 else early
            child = {**env, "BENCH_LOG": str(log), "BENCH_GO": str(go)}
            procs.append(spawn([*mode_argv(case.holders_shared, tag), HOLDER_SCRIPT], child))
        wait_until(lambda: all(read_events(log) for log in held), 15 + case.holders, "holders")
        for log, err in zip(waited, errs, strict=True):
            argv = [*mode_argv(case.waiters_shared, tag), WAITER_SCRIPT]
            with err.open("w") as stderr:
                procs.append(spawn(argv, {**env, "BENCH_LOG": str(log)}, stderr=stderr))
        wait_until(lambda: all("waiting" in e.read_text() for e in errs), 30, "waiters")
        time.sleep(SETTLE_S)
        if case.holders > 1:  # every holder but the last goes first, wholly
            early.touch()
            for proc in procs[: case.holders - 1]:
                reap(proc, timeout=20)
            time.sleep(SETTLE_S)
        last.touch()
        for proc in procs:
            reap(proc, timeout=20 + case.waiters)
    finally:
        for proc in procs:
            if proc.poll() is None:
                reap(proc, timeout=0)
    exits = [t for log in held for t, k in read_events(log) if k == "e"]
    starts = [t for log in waited for t, k in read_events(log) if k == "s"]
    last_exit = next(t for t, k in read_events(held[-1]) if k == "e")
    spread = max(starts) - min(starts) if case.waiters > 1 else None
    return max(starts) - last_exit, spread, sum(1 for s in starts if s < max(exits))


def section_handoff_modes(
    kinds: list[StoreKind], envs: Envs, budget: Budget, workdir: Path
) -> Table:
    table = Table(
        "3c. Hand-off between modes (`--shared`: last holder's child exits → last admitted "
        "child starts)",
        ["store", "hand-off", "rounds", "n", "p50 ms", "p25–p75 ms", "p99 ms", "max ms",
         "first → last reader p50 ms", "overlaps", "× exclusive p50"],
    )  # fmt: skip
    started = time.monotonic()
    broken = {k.name: run_refused(k, envs.warm) if k.reason is None else None for k in kinds}
    live = [k for k in kinds if k.reason is None and broken[k.name] is None]
    refused = {kind.name: run_refused(kind, envs.warm, "--shared") for kind in live}
    cases = mode_cases(budget.modes_readers)
    pairs = [(k, c) for k in live for c in cases if c is PLAIN or refused[k.name] is None]
    results: dict[tuple[str, str], tuple[list[float], list[float], int]] = {
        (k.name, c.label): ([], [], 0) for k, c in pairs
    }
    rng = random.Random(3)
    deadline = time.monotonic() + budget.modes_seconds
    rounds = 0
    for r in range(budget.modes_rounds):
        if r and time.monotonic() > deadline:
            break
        for n, (kind, case) in enumerate(rng.sample(pairs, len(pairs))):  # interleaved
            gap, spread, overlaps = mode_round(kind, envs.warm, case, f"{r}-{n}", workdir)
            gaps, spreads, all_overlaps = results[(kind.name, case.label)]
            spreads += [] if spread is None else [spread]
            results[(kind.name, case.label)] = ([*gaps, gap], spreads, all_overlaps + overlaps)
        rounds += 1
    for kind in kinds:
        if (kind.reason or broken[kind.name]) is not None:
            table.skip(kind.name, kind.reason or broken[kind.name] or "")
    for kind in live:
        plain = [g * 1000 for g in results[(kind.name, PLAIN.label)][0]]
        for case in cases:
            if (kind.name, case.label) not in results:
                continue
            gaps, spreads, overlaps = results[(kind.name, case.label)]
            ms = [g * 1000 for g in gaps]
            table.add(kind.name, case.label, rounds, len(ms), median(ms), quartiles(ms), p99(ms),
                      max(ms) if ms else None,
                      median([s * 1000 for s in spreads]) if spreads else None, overlaps,
                      median(ms) / median(plain))  # fmt: skip
        if refused[kind.name] is not None:
            table.skip(f"{kind.name} (--shared rows)", refused[kind.name] or "")
    table.notes += [
        prose(
            f"""Each round runs every (store, hand-off) once, in a freshly shuffled order. One
                hand-off: holders `tasklock run K [--shared] --wait {MODES_WAIT} -- bash -c …`
                start and their children run (each appends `s $EPOCHREALTIME` to a log of
                its own); then the waiters start and are confirmed waiting (their `waiting`
                event), {SETTLE_S:g} s settle; with several holders, all but the last let
                their children exit (`e $EPOCHREALTIME`) and their wrappers are reaped,
                {SETTLE_S:g} s settle; then the last holder's child exits. The value is the
                last waiter's `s` − the last holder's `e` (section 3's scripts and clock).
                `exclusive → R shared`: one exclusive holder, R `--shared` waiters, all
                admitted by that one release: the time until the last reader's child starts.
                `R shared → exclusive`: R `--shared` holders, one exclusive waiter: the time
                from the last reader's exit to the writer's child starting."""
        ),
        prose(
            """`exclusive → exclusive`: the plain hand-off (section 3's, one waiter) measured
                by the same code in the same rounds; `× exclusive p50` = this row's p50 ÷ that
                row's, same store. `first → last reader`: between the first and the last
                reader's child start in one hand-off (0 if they are admitted at once).
                `overlaps`: a waiter's child starting before a holder's child exited
                (must be 0). `rounds` counts rounds; `n`, samples. p99 is nearest-rank (below
                100 samples the maximum); `p25–p75` nearest-rank."""
        ),
    ]
    table.seconds = time.monotonic() - started
    return table
