"""Markdown tables and the target checks for benchmarks/run.py's results."""

from __future__ import annotations

import math
from typing import Any

NAMES = {
    "floor": "floor (heap + create_task)",
    "model": "floor + cronlock's promises (model)",
    "cronlock": "cronlock",
    "aps3": "APScheduler 3.11 AsyncIOScheduler",
    "aps4": "APScheduler 4.0.0a6 AsyncScheduler",
    "aiocron": "aiocron 2.1",
}


def num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def ratio(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    if math.isnan(a) or math.isnan(b):
        return None
    return a / b


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def precision_table(data: dict[str, Any]) -> list[str]:
    header = ["contender", "jobs", "late p50 ms", "p99 ms", "max ms", "fired/due"]
    header += ["CPU µs/fire", "burst fires/s", "p99 vs APS3", "p99 vs floor", "CPU vs APS3"]
    header += ["CPU vs floor", "CPU vs model"]
    rows = []
    for jobs, by in data.items():
        for name, r in by.items():
            if "error" in r:
                rows.append([NAMES[name], jobs, f"error: {r['error']}", *[""] * 10])
                continue
            rows.append(
                [
                    NAMES[name],
                    f"{int(jobs):,}",
                    num(r["p50_ms"]),
                    num(r["p99_ms"]),
                    num(r["max_ms"]),
                    f"{r['fires']:,.0f}/{r['expected']:,.0f}",
                    num(r["cpu_us_per_fire"]),
                    num(r["burst_fires_per_s"], 0),
                    fmt_ratio(ratio(r["p99_ms"], by.get("aps3", {}).get("p99_ms"))),
                    fmt_ratio(ratio(r["p99_ms"], by.get("floor", {}).get("p99_ms"))),
                    fmt_ratio(
                        ratio(r["cpu_us_per_fire"], by.get("aps3", {}).get("cpu_us_per_fire"))
                    ),
                    fmt_ratio(
                        ratio(r["cpu_us_per_fire"], by.get("floor", {}).get("cpu_us_per_fire"))
                    ),
                    fmt_ratio(
                        ratio(r["cpu_us_per_fire"], by.get("model", {}).get("cpu_us_per_fire"))
                    ),
                ]
            )
    return _table(header, rows)


def scale_table(data: dict[str, Any]) -> list[str]:
    header = ["contender", "register s", "RSS B/job", "idle CPU %", "late p50 ms", "p99 ms"]
    header += ["max ms", "fired/due", "RSS vs APS3", "p99 vs APS3", "p99 vs floor"]
    rows = []
    aps3, floor = data.get("aps3", {}), data.get("floor", {})
    for name in NAMES:
        r = data.get(name)
        if r is None:
            continue
        if "error" in r:
            rows.append([NAMES[name], f"error: {r['error']}", *[""] * 9])
            continue
        rows.append(
            [
                NAMES[name],
                num(r["register_s"], 2),
                num(r["rss_bytes_per_job"], 0),
                num(r["idle_cpu_pct"], 2),
                num(r["p50_ms"]),
                num(r["p99_ms"]),
                num(r["max_ms"]),
                f"{r['fires']:,.0f}/{r['expected']:,.0f}",
                fmt_ratio(ratio(r["rss_bytes_per_job"], aps3.get("rss_bytes_per_job"))),
                fmt_ratio(ratio(r["p99_ms"], aps3.get("p99_ms"))),
                fmt_ratio(ratio(r["p99_ms"], floor.get("p99_ms"))),
            ]
        )
    return _table(header, rows)


def coordination_table(r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [f"error: {r['error']}"]
    rows = []
    for label, title in (("lock", "lock alone (ledger=False)"), ("ledger", "with the run ledger")):
        x = r[label]
        conns = ", ".join(
            f"{c['server_connections']} at {c['jobs']} running" for c in x["connections"]
        )
        rows.append(
            [
                title,
                f"{num(x['locked_p50_us'], 0)} / {num(x['locked_p99_us'], 0)}",
                f"{num(x['select1_p50_us'], 0)} / {num(x['select1_p99_us'], 0)}",
                fmt_ratio(ratio(x["locked_p50_us"], x["select1_p50_us"])),
                f"{num(x['locked_round_trips'], 2)} (SELECT 1: {num(x['select1_round_trips'], 2)})",
                conns,
            ]
        )
    header = ["PostgresLocker", "locked run p50 / p99 µs", "SELECT 1 p50 / p99 µs"]
    header += ["p50 ratio", "round trips per run", "server connections of one replica"]
    return _table(header, rows)


def replicas_table(data: dict[str, Any]) -> list[str]:
    header = ["PostgresLocker", "slot runs due", "ran", "duplicates", "misses"]
    header += ["start late p50 ms", "p99 ms", "settle p50 s", "settle max s"]
    header += ["runs per replica", "round trips per slot run, per replica"]
    rows = []
    for hold, r in data.items():
        if "error" in r:
            rows.append([hold, f"error: {r['error']}", *[""] * 9])
            continue
        rows.append(
            [
                hold,
                f"{r['expected']:,}",
                f"{r['ran']:,}",
                f"{r['duplicates']:,}",
                f"{r['misses']:,}",
                num(r.get("start_p50_ms")),
                num(r.get("start_p99_ms")),
                num(r["settle_p50_s"], 2),
                num(r["settle_max_s"], 2),
                " / ".join(f"{n:,}" for n in r["runs_per_replica"]),
                " / ".join(num(x, 2) for x in r.get("round_trips", [])),
            ]
        )
    return _table(header, rows)


def burst_table(data: dict[str, Any]) -> list[str]:
    header = ["jobs due at once", "slot runs due", "ran", "duplicates", "misses"]
    header += ["start late p50 ms", "p99 ms", "last start s", "runs per replica"]
    header += ["round trips per slot run, per replica", "server CPU % of machine"]
    header += ["replica CPU s"]
    rows = []
    for jobs, r in data.items():
        if "error" in r:
            rows.append([f"{int(jobs):,}", f"error: {r['error']}", *[""] * 10])
            continue
        rows.append(
            [
                f"{int(jobs):,}",
                f"{r['expected']:,}",
                f"{r['ran']:,}",
                f"{r['duplicates']:,}",
                f"{r['misses']:,}",
                num(r["start_p50_ms"]),
                num(r["start_p99_ms"]),
                num(r["last_start_s"], 2),
                " / ".join(f"{n:,}" for n in r["runs_per_replica"]),
                " / ".join(num(x, 2) for x in r["round_trips"]),
                num(r.get("server_cpu_pct"), 0),
                " / ".join(num(x, 2) for x in r["replica_cpu_s"]),
            ]
        )
    return _table(header, rows)


def skew_table(data: dict[str, Any]) -> list[str]:
    header = ["clocks", "slot runs due", "ran", "duplicates", "misses", "runs per replica"]
    header += ["largest share", "start p50 ms", "earliest ms", "|start - slot| p99 ms"]
    rows = []
    for mode, r in data.items():
        if "error" in r:
            rows.append([mode, f"error: {r['error']}", *[""] * 8])
            continue
        runs = r["runs_per_replica"]
        rows.append(
            [
                mode,
                f"{r['expected']:,}",
                f"{r['ran']:,}",
                f"{r['duplicates']:,}",
                f"{r['misses']:,}",
                " / ".join(f"{n:,}" for n in runs),
                f"{100 * max(runs) / max(sum(runs), 1):.0f} %",
                num(r.get("start_p50_ms")),
                num(r.get("start_min_ms")),
                num(r.get("start_abs_p99_ms")),
            ]
        )
    return _table(header, rows)


def import_table(data: dict[str, float]) -> list[str]:
    base = data.get("aps3:apscheduler.schedulers.asyncio")
    rows = [
        [
            f"`import {key.split(':', 1)[1]}` ({NAMES[key.split(':')[0]]})",
            num(ms),
            fmt_ratio(ratio(ms, base)),
        ]
        for key, ms in data.items()
    ]
    return _table(["import", "ms", "vs APScheduler 3's AsyncIOScheduler"], rows)


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its measured value and whether it is met (None: not measured)."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, limit: float, shown: str, below: bool = True) -> None:
        met = None if value is None else (value < limit if below else value <= limit)
        out.append({"target": name, "measured": shown, "met": met})

    def add_met(name: str, shown: str, met: bool | str | None) -> None:
        out.append({"target": name, "measured": shown, "met": met})

    prec = results.get("precision", {}).get("10000", {})
    c, a, f = prec.get("cronlock", {}), prec.get("aps3", {}), prec.get("floor", {})
    r = ratio(c.get("p99_ms"), a.get("p99_ms"))
    add("lateness p99 @10k jobs <= 1/4 of APScheduler 3", r, 0.25, fmt_ratio(r), below=False)
    r = ratio(c.get("p99_ms"), f.get("p99_ms"))
    add("lateness p99 @10k jobs <= 1.5x the floor's", r, 1.5, fmt_ratio(r), below=False)
    r = ratio(c.get("cpu_us_per_fire"), f.get("cpu_us_per_fire"))
    add("CPU per fire @10k jobs <= 1.5x the floor's", r, 1.5, fmt_ratio(r), below=False)
    # What the promises cost by themselves (c_model.py): not a target, the yardstick for one.
    m = prec.get("model", {})
    for label, key in (("CPU per fire", "cpu_us_per_fire"), ("lateness p99", "p99_ms")):
        r = ratio(m.get(key), f.get(key))
        add_met(f"{label} @10k jobs: floor + promises (model) vs the floor", fmt_ratio(r), "info")
        r = ratio(c.get(key), m.get(key))
        add_met(f"{label} @10k jobs: cronlock vs floor + promises (model)", fmt_ratio(r), "info")
    sc = results.get("scale", {})
    jobs = sc.get("params", {}).get("jobs", 0)
    s, sa = sc.get("cronlock", {}), sc.get("aps3", {})
    r = ratio(s.get("register_s"), sa.get("register_s"))
    add(f"register {jobs:,} jobs <= 1/10 of APScheduler 3's time", r, 0.1, fmt_ratio(r), False)
    r = ratio(s.get("rss_bytes_per_job"), sa.get("rss_bytes_per_job"))
    add(f"RSS per job ({jobs:,} jobs) <= APScheduler 3's", r, 1.0, fmt_ratio(r), below=False)
    v = s.get("idle_cpu_pct")
    add(f"< 1% CPU while nothing is due ({jobs:,} jobs)", v, 1.0, f"{num(v, 3)} %")
    imports = results.get("import", {})
    base = imports.get("aps3:apscheduler.schedulers.asyncio")
    for key, ms in imports.items():
        if key.startswith("cronlock:"):
            r = ratio(ms, base)
            what = key.split(":", 1)[1].split("; ")[-1]
            what = what if what.startswith("from ") else f"import {what}"
            add(f"`{what}` no slower than APScheduler 3's", r, 1.0, fmt_ratio(r), below=False)
    for label in ("lock", "ledger"):
        co = results.get("coordination", {}).get(label, {})
        v = co.get("locked_round_trips")
        add(f"a locked run costs <= 2 round trips ({label})", v, 2.0, num(v, 2), below=False)
        conns = [x["server_connections"] for x in co.get("connections", [])]
        if conns:
            shown = " / ".join(
                f"{x['server_connections']} at {x['jobs']} jobs" for x in co["connections"]
            )
            out.append(
                {
                    "target": f"one replica's server connections bounded ({label})",
                    "measured": shown,
                    "met": max(conns) == min(conns),
                }
            )
    b = results.get("burst", {}).get("10000")
    if b is not None:
        ok = "error" not in b
        shown = f"{b['ran']:,} ran, {b['duplicates']:,} duplicates" if ok else "error"
        add_met(
            "burst of 10,000 jobs at one instant, 3 replicas: every slot run exactly once",
            shown,
            (b["misses"] == 0 and b["duplicates"] == 0) if ok else None,
        )
        v = b.get("last_start_s")
        add(
            "burst of 10,000 jobs: the last one started within 2 s",
            v,
            2.0,
            f"{num(v, 2)} s",
            below=False,
        )
    defaults = [
        k for k in results.get("skew", {}) if k.endswith("fleet time + fair race (default)")
    ]
    sk = results["skew"][defaults[-1]] if defaults else None  # the most jobs
    if sk is not None:
        ok = "error" not in sk
        add_met(
            f"clocks 0/+150/+300 ms, 3 replicas, {defaults[-1].split(':')[0]}: every slot run once",
            f"{sk['ran']:,}/{sk['expected']:,} ran, {sk['duplicates']:,} duplicates"
            if ok
            else "error",
            (sk["misses"] == 0 and sk["duplicates"] == 0) if ok else None,
        )
        share = max(sk["runs_per_replica"]) / max(sum(sk["runs_per_replica"]), 1) if ok else None
        add(
            "clocks 0/+150/+300 ms: no replica runs more than half of the runs",
            share,
            0.5,
            " / ".join(f"{n:,}" for n in sk["runs_per_replica"]) if ok else "error",
            below=False,
        )
        v = sk.get("start_abs_p99_ms")
        add(
            "clocks 0/+150/+300 ms: starts within 20 ms of the slot in true time at p99",
            v,
            20.0,
            f"{num(v)} ms",
            below=False,
        )
    rep = results.get("replicas", {}).get("run ledger (default)")
    if rep is not None:
        ok = "error" not in rep
        shown = (
            f"{rep['ran']:,}/{rep['expected']:,} ran, {rep['duplicates']:,} duplicates, "
            f"{rep['misses']:,} misses"
            if ok
            else "error"
        )
        add_met(
            "3 replicas x 1,000 jobs every second (ledger): all run, 0 duplicates, 0 misses",
            shown,
            (rep["misses"] == 0 and rep["duplicates"] == 0) if ok else None,
        )
        v = rep.get("start_p99_ms")
        add(
            "3 replicas x 1,000 jobs every second: start p99 <= 500 ms",
            v,
            500.0,
            f"{num(v)} ms",
            below=False,
        )
    return out


def render(results: dict[str, Any]) -> str:
    lines = [
        f"Measured {results['date']} on {results['machine']}; mode {results['mode']}, "
        f"{results['repeats']} repeat(s) (median), {results.get('elapsed_s', '?')} s in all.",
        "",
    ]
    if "precision" in results:
        lines += ["#### 1-2. Fire precision and cost: N no-op jobs due every second", ""]
        lines += [*precision_table(results["precision"]), ""]
    if "scale" in results:
        p = results["scale"]["params"]
        lines += [
            f"#### 3. Scale: {p['jobs']:,} jobs every {p['interval']} s, due times spread "
            f"over {p['spread']} s of it",
            "",
        ]
        lines += [*scale_table(results["scale"]), ""]
    if "coordination" in results:
        lines += ["#### 4. Coordination cost on PostgreSQL (cronlock only)", ""]
        lines += [*coordination_table(results["coordination"]), ""]
    if "replicas" in results:
        lines += ["#### 5. Three replicas x 1,000 locked jobs every second", ""]
        lines += [*replicas_table(results["replicas"]), ""]
    if "burst" in results:
        lines += [
            "#### 6. Burst: N locked jobs due at one instant across three replicas (run ledger on)",
            "",
        ]
        lines += [*burst_table(results["burst"]), ""]
    if "skew" in results:
        lines += [
            "#### 6b. Skewed host clocks: three replicas 0 / +150 / +300 ms ahead, N locked "
            "jobs every second (run ledger on; times in true time)",
            "",
        ]
        lines += [*skew_table(results["skew"]), ""]
    if "import" in results:
        lines += ["#### 7. Import time (median of fresh interpreters)", ""]
        lines += [*import_table(results["import"]), ""]
    if results.get("targets"):
        lines += ["#### Targets", ""]
        verdicts = {True: "met", False: "**not met**", None: "n/a", "info": "(yardstick)"}
        rows = [[t["target"], t["measured"], verdicts[t["met"]]] for t in results["targets"]]
        lines += [*_table(["target", "measured", ""], rows), ""]
    return "\n".join(lines)
