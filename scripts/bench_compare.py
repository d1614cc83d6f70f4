#!/usr/bin/env python3
"""The comparisons the benchmark scripts print: pcieipc's `bench` runs
against OpenMPI's (scripts/bench-vs-mpi.sh), NCCL's (scripts/bench-vs-nccl.sh),
another pcieipc build's (BASELINE= in those and scripts/bench-trace-overhead.sh),
and DDP step times per backend (scripts/bench-ddp.sh). The scripts run the
programs in turns into a work directory; this reads what they left there and
does the rest: parsing, medians and bests over the alternating runs, the
per-size tables with their ratios, and the exit status.

    bench_compare.py mpi WORK [--repeat N] [--latency-repeat N] [--steal-retries N] [--baseline] [--relay]
    bench_compare.py timed-ms FILE CALLS
    bench_compare.py cold-start WORK [--repeat N] [--at-most CALLS]
    bench_compare.py latency WORK [--repeat N] [--tail-ratio R] [--tail-up-to BYTES]
    bench_compare.py nccl WORK --ngpus N [--repeat N] [--baseline]
    bench_compare.py one-gpu WORK [--repeat N] [--modes "gpu host-memory host"] [--baseline]
    bench_compare.py trace-overhead WORK [--repeat N]
    bench_compare.py ddp RUNS
    bench_compare.py --self-test

What WORK holds, per subcommand (RUN counts from 1):
- mpi: pcieipc-8-RUN.json, pcieipc-RUN.SIZE.json (`pcieipc bench --json`),
  mpi-8-RUN.txt, mpi-RUN.SIZE.txt (bench/mpi_allreduce.c's lines), the same
  as baseline-* and relay-* where asked, host-RUN.txt ("SIZE GB/s" lines of
  bench/cross_core.c) and steal.txt ("SIDE SIZE REMAKES STOLEN_MS ALLOWED_MS"
  lines); a run set aside for steal (*.stolen-N) is not read;
- nccl: pcieipc-RUN.json, baseline-RUN.json, nccl-RUN.jsonl
  (bench/nccl_allreduce.py's lines);
- one-gpu: pcieipc-MODE-RUN.json and, with --baseline, baseline-MODE-RUN.json
  (`pcieipc bench --transport cuda --json`, MODE one of gpu, host-memory, host);
- trace-overhead: baseline-RUN.out, off-RUN.out, on-RUN.out (`pcieipc bench`'s
  text table);
- cold-start: pcieipc-RUN.json (`pcieipc bench --cold-start --json`),
  mpi-RUN.txt (bench/mpi_allreduce.c --cold-start's "SIZE T1 ... TN" lines),
  copy-RUN.txt (bench/copy_warmup.c's, the same form);
- latency: pcieipc-RUN.SIZE.json (`pcieipc bench --json`, its latency_us),
  mpi-RUN.SIZE.txt (bench/mpi_allreduce.c --latency's lines, its "calls"
  lines read), gaps-RUN.txt (bench/host_gaps.c's "gaps CPU SECONDS G1 ..."
  lines, one per rank's CPU), floor-RUN.SIZE.txt (bench/handoff_floor.c's
  "calls" line, at the sizes it ran).
timed-ms FILE: one run's output, pcieipc's JSON report or MPI's lines; prints
the milliseconds its timed calls took over CALLS calls. ddp RUNS: the
script's "run N: BACKEND MS" lines.

Exit status: 0; 1 where a run's output cannot be compared (wrong values);
2 on bad usage; 3 (mpi) where pcieipc's median is behind MPI's anywhere,
(cold-start) where pcieipc's median calls to steady exceed --at-most at any
size, (latency) where pcieipc's median p99.7 exceeds MPI's at any size or
--tail-ratio times its own p50 up to --tail-up-to bytes, then also written,
a reason a line, to WORK/behind.
"""

import argparse
import collections
import contextlib
import glob
import io
import json
import os
import re
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = "docs/schemas/bench-v1.schema.json"
COLD_START_SCHEMA = "docs/schemas/bench-cold-start-v1.schema.json"
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "bench")
BEHIND = 3

# One side's run of one size is a row: (out-of-place time, out-of-place busbw,
# in-place time, in-place busbw); times in us, the lowest best; busbw in GB/s,
# the highest best. A side that has no value for a column holds None there.
TIME_OOP, BUSBW_OOP, TIME_IP, BUSBW_IP = range(4)
TIMES = (TIME_OOP, TIME_IP)


class Broken(Exception):
    """A run whose results cannot be compared (its own check found wrong values)."""


# What one `pcieipc bench` run printed: its rows by size, the path its header
# names (None from the text table) and its wrong values (None: not read).
Output = collections.namedtuple("Output", "rows path wrong")


def is_report(text):
    """Whether a run's output is pcieipc's --json report (not a text table, nor MPI's lines)."""
    return text.lstrip().startswith("{")


def report_schema(name):
    """The JSON schema docs/schemas/NAME to validate pcieipc's reports
    against, or None, said on stdout, where python3-jsonschema is missing."""
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        print(f"# bench JSON not validated against {name}: python3-jsonschema missing")
        return None
    return json.load(open(os.path.join(ROOT, name)))


def validated(report, schema):
    """`report`, checked against `schema` unless that is None."""
    if schema is not None:
        import jsonschema
        jsonschema.validate(report, schema)
    return report


def pcieipc_output(file, schema=None):
    """One `pcieipc bench` run's output: its --json report (validated against
    `schema` when given) or its text table, whose columns 1, 6, 8, 10 and 12
    are the size and the times and busbw out of place and in place."""
    text = open(file).read()
    if not is_report(text):
        rows = {}
        for line in text.splitlines():
            if re.match(r" +[0-9]", line):
                fields = line.split()
                rows[int(fields[0])] = tuple(float(fields[at]) for at in (5, 7, 9, 11))
        return Output(rows, None, None)
    report = validated(json.loads(text), schema)
    rows = {row["size_bytes"]: (row["out_of_place"]["time_us"], row["out_of_place"]["busbw_gb_s"],
                                row["in_place"]["time_us"], row["in_place"]["busbw_gb_s"])
            for row in report["results"]}
    return Output(rows, report.get("path", report["transport"]), report["wrong"])


def checked(output, label):
    """The output's rows, unless its run found wrong values."""
    if output.wrong:
        raise Broken(f"{label} bench reported {output.wrong} wrong values")
    return output.rows


def mpi_output(file):
    """bench/mpi_allreduce.c's lines: size, then time and busbw out of place
    and in place; comment lines start with #, per-call lines (--latency) with
    "calls"."""
    rows = {}
    for line in open(file):
        if line.startswith(("#", "calls ")) or not line.strip():
            continue
        size, *values = line.split()
        rows[int(size)] = tuple(float(value) for value in values)
    return rows


def nccl_output(file):
    """bench/nccl_allreduce.py's JSON lines: in-place time only. Its
    --latency lines ("calls ...", read by mpi_calls) and what the library
    printed (Gloo's and NCCL's own lines) are passed over."""
    rows = {}
    for line in open(file):
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row["wrong"]:
            raise Broken(f"NCCL all_reduce gave {row['wrong']} wrong values")
        rows[row["size_bytes"]] = (None, None, row["ip_us"], None)
    return rows


def by_size(outputs):
    """{size: [each run's row at that size]} over runs' rows by size."""
    runs = {}
    for rows in outputs:
        for size, row in rows.items():
            runs.setdefault(size, []).append(row)
    return runs


def run_files(work, name, runs, ext):
    """A side's outputs of runs 1..runs: NAME-RUN.EXT (one for the sweep) or
    NAME-RUN.SIZE.EXT (one per size)."""
    return [file for run in range(1, runs + 1)
            for file in glob.glob(f"{work}/{name}-{run}.{ext}") + glob.glob(f"{work}/{name}-{run}.*.{ext}")]


def median(rows, at):
    return statistics.median(row[at] for row in rows)


def best(rows, at):
    return (min if at in TIMES else max)(row[at] for row in rows)


def medians(runs):
    """{size: row of the runs' medians}."""
    return {size: tuple(median(rows, at) for at in range(4)) for size, rows in runs.items()}


def timed_ms(file, calls):
    """The ms a run's timed calls took: every time in its output, out of
    place and in place, times the calls it made at that size."""
    rows = pcieipc_output(file).rows if is_report(open(file).read()) else mpi_output(file)
    return int(sum(row[at] for row in rows.values() for at in TIMES) * calls / 1000)


# --- scripts/bench-vs-mpi.sh ------------------------------------------------

def host_rates(work, repeat):
    """The host's cross-core copy rate measured beside each size, per size."""
    host = {}
    for run in range(1, repeat + 1):
        for line in open(f"{work}/host-{run}.txt"):
            size, rate = line.split()
            host.setdefault(int(size), []).append(float(rate))
    return host


def ratio_table(ours, theirs, title, repeat, host, labels=("pcieipc", "MPI")):
    """Median busbw of both sides per size, their ratio, the ratio of bests
    and the host's rate; returns the lowest ratio of medians. Columns as wide
    as their labels, so that a table without the baseline reads as it always
    has. The last column: the host's cross-core copy rate measured beside that
    size's runs, median (lowest-highest)."""
    w_ours, w_theirs = len(labels[0]) + 6, len(labels[1]) + 6
    print(f"\n# {title}")
    print(f"#{'size':>11} {labels[0] + ' oop':>{w_ours}} {labels[1] + ' oop':>{w_theirs}} {'ratio':>6} "
          f"{labels[0] + ' ip':>{w_ours - 1}} {labels[1] + ' ip':>{w_theirs}} {'ratio':>6}   | best: oop ratio  ip ratio"
          f" | host GB/s")
    ratios, best_ratios = [], []
    # The run-to-run spread's low tail: the most of one size's runs on this
    # side that fell below the other side's median there.
    tail = (0, None, None)
    for size in sorted(ours):
        o, m = ours[size], theirs.get(size)
        if m is None:
            continue
        r_oop, r_ip = median(o, BUSBW_OOP) / median(m, BUSBW_OOP), median(o, BUSBW_IP) / median(m, BUSBW_IP)
        b_oop, b_ip = best(o, BUSBW_OOP) / best(m, BUSBW_OOP), best(o, BUSBW_IP) / best(m, BUSBW_IP)
        ratios += [r_oop, r_ip]
        best_ratios += [b_oop, b_ip]
        for kind, at in (("out of place", BUSBW_OOP), ("in place", BUSBW_IP)):
            below = sum(run[at] < median(m, at) for run in o)
            if below > tail[0]:
                tail = (below, size, kind)
        rates = host.get(size, [])
        rate = f"{statistics.median(rates):.1f} ({min(rates):.1f}-{max(rates):.1f})" if rates else "-"
        print(f"{size:>12} {median(o, BUSBW_OOP):>{w_ours}.2f} {median(m, BUSBW_OOP):>{w_theirs}.2f} {r_oop:>6.2f} "
              f"{median(o, BUSBW_IP):>{w_ours - 1}.2f} {median(m, BUSBW_IP):>{w_theirs}.2f} {r_ip:>6.2f}   | "
              f"{b_oop:>14.2f} {b_ip:>9.2f} | {rate}")
    if not ratios:
        raise Broken(f"{title}: no size that both {labels[0]} and {labels[1]} ran")
    print(f"# lowest ratio: {min(ratios):.2f} of medians, {min(best_ratios):.2f} of bests")
    below, size, kind = tail
    where = f" ({size} B {kind})" if below else ""
    print(f"# {labels[0]}'s runs below {labels[1]}'s median busbw: at most {below} of {repeat} at one size{where}")
    return min(ratios)


def latency_behind(ours8, theirs8):
    """The gate on 8-byte latency: where pcieipc's median time is above MPI's,
    in and out of place."""
    return [f"8 B {kind}: {median(ours8[8], at):.2f} us against {median(theirs8[8], at):.2f}"
            for kind, at in (("out of place", TIME_OOP), ("in place", TIME_IP))
            if median(ours8[8], at) > median(theirs8[8], at)]


def steal_summary(work, steal_retries):
    """What the hypervisor's steal did to the runs (measured in the script), per side."""
    sides = {}
    for line in open(f"{work}/steal.txt"):
        side, _size, remakes, stolen_ms, allowed_ms = line.split()
        kept, remade, over, stolen = sides.get(side, (0, 0, 0, 0))
        sides[side] = (kept + 1, remade + int(remakes), over + (int(stolen_ms) > int(allowed_ms)),
                       stolen + int(stolen_ms))
    print("\n# hypervisor steal (/proc/stat) per side: runs kept, runs made again because it took more than 1% of their"
          f" timed CPU time, kept over that after {steal_retries} remakes, steal met by the kept runs")
    for side, (kept, remade, over, stolen) in sorted(sides.items()):
        print(f"#{side:>11} {kept:>5} kept {remade:>4} remade {over:>4} over {stolen:>7} ms")


def mpi_report(work, repeat, latency_repeat, steal_retries, baseline=False, relay=False):
    """bench-vs-mpi.sh's report; BEHIND where pcieipc's median is behind
    MPI's at 8 bytes or in busbw at any size."""
    schema = report_schema(SCHEMA)
    # The paths each binary's reports name, apart: a baseline that took another
    # path (algorithm) at some size is part of what a before/after shows.
    paths = {"pcieipc": set(), "baseline": set()}

    def ours(name, binary="pcieipc", runs=repeat):
        outputs = [pcieipc_output(file, schema) for file in run_files(work, name, runs, "json")]
        for output in outputs:
            paths[binary].add(output.path)
        return by_size(checked(output, binary) for output in outputs)

    def theirs(name, runs=repeat):
        return by_size(mpi_output(file) for file in run_files(work, name, runs, "txt"))

    host = host_rates(work, repeat)
    ours8, theirs8 = ours("pcieipc-8", runs=latency_repeat), theirs("mpi-8", latency_repeat)
    if baseline:
        base8 = ours("baseline-8", "baseline", latency_repeat)
    print(f"\n# pcieipc: {'; '.join(sorted(paths['pcieipc']))}")
    if baseline:
        print(f"# baseline: {'; '.join(sorted(paths['baseline']))}")
    print(f"\n# 8-byte all_reduce latency (us), median (best) of {latency_repeat} alternating runs of 10000")
    header = "#            pcieipc oop        MPI oop     pcieipc ip         MPI ip"
    columns = [(ours8, TIME_OOP), (theirs8, TIME_OOP), (ours8, TIME_IP), (theirs8, TIME_IP)]
    if baseline:
        header += "     baseline oop     baseline ip"
        columns += [(base8, TIME_OOP), (base8, TIME_IP)]
    print(header)
    print(f"{'8 B':>12} " + "  ".join(f"{median(runs[8], at):>7.2f} ({best(runs[8], at):.2f})" for runs, at in columns))
    behind = latency_behind(ours8, theirs8)

    mpi_busbw = theirs("mpi")
    ours_busbw = ours("pcieipc")
    worst = ratio_table(ours_busbw, mpi_busbw, f"busbw (GB/s), float sum, 2 ranks, median of {repeat} runs alternating "
                        "per size; ratio = pcieipc / MPI", repeat, host)
    if worst < 1.0:
        behind.append(f"busbw: lowest median ratio {worst:.2f}")
    if baseline:
        base = ours("baseline", "baseline")
        ratio_table(base, mpi_busbw, "the baseline's busbw, same runs; ratio = baseline / MPI", repeat, host,
                    ("baseline", "MPI"))
        ratio_table(ours_busbw, base, "this tree's pcieipc against the baseline, same runs; ratio = pcieipc / baseline "
                    "(below 1: slower than before)", repeat, host, ("pcieipc", "baseline"))
    if relay:
        relay8 = ours("relay-8", runs=latency_repeat)
        print(f"\n# pcieipc --single-copy off, 8 B (us): {median(relay8[8], TIME_OOP):.2f} / "
              f"{median(relay8[8], TIME_IP):.2f}")
        ratio_table(ours("relay"), mpi_busbw, "pcieipc --single-copy off (the ring and its relay slots only), same "
                    "runs; ratio = relay / MPI", repeat, host)
    steal_summary(work, steal_retries)
    if not behind:
        return 0
    print("\n# FAILED: pcieipc's median is behind MPI's: " + "; ".join(behind))
    open(f"{work}/behind", "w").write("\n".join(behind))
    return BEHIND


# --- scripts/cold-start-vs-mpi.sh -------------------------------------------

def to_steady(calls):
    """`pcieipc bench --cold-start`'s rule (cmd_bench.rs, `ColdStart`):
    (steady, calls): the steady time is the median of the last quarter of
    the calls (the upper one of an even count), and the count the first call
    within 10% of it, from 1 (all of them where none is)."""
    tail = sorted(calls[len(calls) - -(-len(calls) // 4):])
    steady = tail[len(tail) // 2]
    first = next((at + 1 for at, us in enumerate(calls) if us <= steady * 1.1), len(calls))
    return steady, first


def cold_start_report(work, repeat, at_most):
    """cold-start-vs-mpi.sh's table: per size and side, the medians over
    the runs of the first call, the steady time and the calls to steady;
    BEHIND where pcieipc's median calls exceed `at_most` at any size."""
    schema = report_schema(COLD_START_SCHEMA)
    sides = {"pcieipc": {}, "MPI": {}, "copy": {}}
    for run in range(1, repeat + 1):
        report = validated(json.load(open(f"{work}/pcieipc-{run}.json")), schema)
        for row in report["results"]:
            steady, calls = to_steady(row["calls_us"])
            if (steady, calls) != (row["steady_us"], row["calls_to_steady"]):
                raise Broken(f"pcieipc-{run}.json, {row['size_bytes']} B: the report says steady "
                             f"{row['steady_us']} after {row['calls_to_steady']} calls, its calls say "
                             f"{steady} after {calls}")
            sides["pcieipc"].setdefault(row["size_bytes"], []).append(row["calls_us"])
        for side, name in (("MPI", "mpi"), ("copy", "copy")):
            for line in open(f"{work}/{name}-{run}.txt"):
                if line.startswith("#") or not line.strip():
                    continue
                size, *calls = line.split()
                sides[side].setdefault(int(size), []).append([float(us) for us in calls])
    print(f"# cold start: all_reduce out of place, float sum, each size's calls from cold, each the slowest "
          f"rank's; medians of {repeat} alternating runs; calls = calls to within 10% of steady (the median of "
          "the last quarter); host copy = the same of a memcpy of both ranks' buffers (bench/copy_warmup.c)")
    print("#       size   pcieipc first  steady (us)  calls  |   MPI first  steady (us)  calls  |  host copy calls")
    behind = []
    for size in sorted(sides["pcieipc"]):
        cells = []
        for side in ("pcieipc", "MPI"):
            runs = sides[side].get(size, [])
            if len(runs) != repeat:
                raise Broken(f"{side}: {len(runs)} runs of {size} B, not {repeat}")
            steady = statistics.median(to_steady(calls)[0] for calls in runs)
            count = statistics.median(to_steady(calls)[1] for calls in runs)
            first = statistics.median(calls[0] for calls in runs)
            cells.append(f"{first:>11.1f}  {steady:>11.1f}  {count:>5g}")
            if side == "pcieipc" and count > at_most:
                behind.append(f"{size} B: {count:g} calls to steady (at most {at_most})")
        copies = sides["copy"].get(size, [])
        if len(copies) != repeat:
            raise Broken(f"host copy: {len(copies)} runs of {size} B, not {repeat}")
        copy_calls = statistics.median(to_steady(calls)[1] for calls in copies)
        print(f"{size:>12}  {cells[0]}  |  {cells[1]}  |  {copy_calls:>15g}")
    if not behind:
        return 0
    print("\n# FAILED: pcieipc takes more calls to steady than it may: " + "; ".join(behind))
    open(f"{work}/behind", "w").write("\n".join(behind))
    return BEHIND


# --- scripts/latency-vs-mpi.sh ---------------------------------------------

# The statistics of a per-call distribution, as `pcieipc bench` reports them
# (userspace/cli/src/bench_latency.rs): nearest-rank percentiles, each a call
# that happened, then the maximum and the population standard deviation.
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_7", 99.7))


def distribution(calls):
    """{p50, p90, p99, p99_7, max, mean, stddev, calls} of a list of call times."""
    ordered = sorted(calls)
    n = len(ordered)
    result = {name: ordered[min(max(-(-n * round(percent * 10) // 1000), 1), n) - 1]
              for name, percent in PERCENTILES}
    mean = sum(ordered) / n
    result.update(max=ordered[-1], mean=mean, calls=n,
                  stddev=(sum((us - mean) ** 2 for us in ordered) / n) ** 0.5)
    return result


def mpi_calls(file):
    """bench/mpi_allreduce.c --latency's "calls SIZE oop|ip T1 ... TN" lines:
    {(size, "out_of_place" or "in_place"): [call times in us]}."""
    series = {}
    for line in open(file):
        if line.startswith("calls "):
            _, size, placement, *calls = line.split()
            key = (int(size), {"oop": "out_of_place", "ip": "in_place"}[placement])
            series[key] = [float(us) for us in calls]
    return series


def host_gap_rates(work, repeat):
    """The gaps bench/host_gaps.c saw on the ranks' CPUs: (gaps in us,
    seconds) summed over the runs, per CPU."""
    cpus = {}
    for run in range(1, repeat + 1):
        for line in open(f"{work}/gaps-{run}.txt"):
            _, cpu, seconds, *gaps = line.split()
            had, span = cpus.get(cpu, ([], 0.0))
            cpus[cpu] = (had + [float(gap) for gap in gaps], span + float(seconds))
    if len(cpus) < 2:
        raise Broken(f"gaps-*.txt: {len(cpus)} CPU measured, not the two the ranks run on")
    return cpus


def hit_by_gaps(cpus, call_us, at_least_us):
    """The share of calls of `call_us` that the host's gaps of at least
    `at_least_us`, on any rank's CPU, would fall into (their rate times the
    call's time: small shares)."""
    rate = sum(sum(gap >= at_least_us for gap in gaps) / seconds for gaps, seconds in cpus.values())
    return rate * call_us * 1e-6


def nccl_latency_report(work, repeat):
    """bench-vs-nccl.sh LATENCY=1's table: per size, in place (NCCL's only
    placement through torch), each side's median over the runs of p50, p99,
    p99.7, the maximum and the standard deviation, its p99.7 / p50, and
    pcieipc's p99.7 / NCCL's."""
    schema = report_schema(SCHEMA)
    sides = {"pcieipc": {}, "NCCL": {}}
    for run in range(1, repeat + 1):
        name = f"pcieipc-{run}.json"
        report = validated(json.load(open(os.path.join(work, name))), schema)
        if report["wrong"]:
            raise Broken(f"{name}: pcieipc bench reported {report['wrong']} wrong values")
        for row in report["results"]:
            latency = row["in_place"].get("latency_us")
            if latency is None:
                raise Broken(f"{name}: no latency_us at {row['size_bytes']} B in place (a run without --latency)")
            sides["pcieipc"].setdefault(row["size_bytes"], []).append(latency)
        name = os.path.join(work, f"nccl-{run}.jsonl")
        nccl_output(name)
        calls = mpi_calls(name)
        if not calls:
            raise Broken(f"nccl-{run}.jsonl: no \"calls\" lines (a run without --latency)")
        for (size, _placement), times in calls.items():
            sides["NCCL"].setdefault(size, []).append(distribution(times))
    print(f"# per-call latency (us), all_reduce float sum in place, on GPUs pcieipc's between the job's ends of successive "
          f"calls (stamped there), NCCL's by the events between the queued calls (the ranks' mean), on CPUs the slowest "
          f"rank's; medians of {repeat} runs; tail = p99.7 / p50")
    print("#       size  calls |  pcieipc p50      p99    p99.7      max   stddev   tail |"
          "     NCCL p50      p99    p99.7      max   stddev   tail | p99.7 pcieipc / NCCL")
    for size in sorted(set(sides["pcieipc"]) & set(sides["NCCL"])):
        cells, middle = [], {}
        for side in ("pcieipc", "NCCL"):
            runs = sides[side][size]
            if len(runs) != repeat:
                raise Broken(f"{side}: {len(runs)} runs of {size} B, not {repeat}")
            middle[side] = m = {stat: statistics.median(run[stat] for run in runs)
                                for stat in ("p50", "p99", "p99_7", "max", "stddev", "calls")}
            cells.append(f"{m['p50']:>12.2f} {m['p99']:>8.2f} {m['p99_7']:>8.2f} {m['max']:>8.1f} "
                         f"{m['stddev']:>8.3f} {m['p99_7'] / m['p50']:>6.2f}")
        against = middle["pcieipc"]["p99_7"] / middle["NCCL"]["p99_7"]
        print(f"{size:>12} {middle['pcieipc']['calls']:>6g} |{cells[0]} |{cells[1]} | {against:>20.3g}")
    if not set(sides["pcieipc"]) & set(sides["NCCL"]):
        raise Broken("no size that both pcieipc and NCCL ran")
    return 0


def latency_report(work, repeat, tail_ratio, tail_up_to):
    """latency-vs-mpi.sh's table: per size and placement, each side's
    median over the runs of p50, p99, p99.7, the maximum and the standard
    deviation, pcieipc's p99.7 / p50 and its p99.7 / MPI's; BEHIND where
    pcieipc's p99.7 is above MPI's, or above tail_ratio times its p50 at
    sizes up to tail_up_to."""
    schema = report_schema(SCHEMA)
    sides = {"pcieipc": {}, "MPI": {}, "floor": {}}
    for run in range(1, repeat + 1):
        for file in glob.glob(f"{work}/pcieipc-{run}.*.json"):
            report = validated(json.load(open(file)), schema)
            if report["wrong"]:
                raise Broken(f"{os.path.basename(file)}: pcieipc bench reported {report['wrong']} wrong values")
            for row in report["results"]:
                for placement in ("out_of_place", "in_place"):
                    latency = row[placement].get("latency_us")
                    if latency is None:
                        raise Broken(f"{os.path.basename(file)}: no latency_us at {row['size_bytes']} B {placement}")
                    sides["pcieipc"].setdefault((row["size_bytes"], placement), []).append(latency)
        for side, name in (("MPI", "mpi"), ("floor", "floor")):
            for file in glob.glob(f"{work}/{name}-{run}.*.txt"):
                for key, calls in mpi_calls(file).items():
                    sides[side].setdefault(key, []).append(distribution(calls))
    gaps = host_gap_rates(work, repeat)
    for cpu, (had, seconds) in sorted(gaps.items()):
        print(f"# host: CPU {cpu} lost {sum(had) / seconds / 1e4:.2f}% of {seconds:g} s to {len(had) / seconds:.0f} gaps a "
              f"second over 1 us ({sum(gap >= 10 for gap in had) / seconds:.0f} over 10 us, the longest {max(had, default=0):.0f} us)")
    print(f"# per-call latency (us), all_reduce float sum, 2 ranks, each call the slowest rank's; medians of "
          f"{repeat} runs alternating per size; tail = p99.7 / p50; host = the share of calls as long as pcieipc's p50 "
          f"the host's gaps hit for {tail_ratio - 1:g} x p50 or more; floor = a bare one-shot hand-off in C between the "
          "same CPUs (bench/handoff_floor.c), out of place")
    print("#       size    placement  calls |  pcieipc p50      p99    p99.7      max   stddev   tail |"
          "      MPI p50      p99    p99.7      max   stddev   tail | p99.7 pcieipc / MPI |   host |"
          "  floor p50    p99.7   tail")
    behind = []
    for key in sorted(sides["pcieipc"], key=lambda key: (key[0], key[1] != "out_of_place")):
        size, placement = key
        cells, middle = [], {}
        for side in ("pcieipc", "MPI"):
            runs = sides[side].get(key, [])
            if len(runs) != repeat:
                raise Broken(f"{side}: {len(runs)} runs of {size} B {placement}, not {repeat}")
            middle[side] = {stat: statistics.median(run[stat] for run in runs)
                            for stat in ("p50", "p99", "p99_7", "max", "stddev", "calls")}
            m = middle[side]
            cells.append(f"{m['p50']:>12.2f} {m['p99']:>8.2f} {m['p99_7']:>8.2f} {m['max']:>8.1f} "
                         f"{m['stddev']:>8.3f} {m['p99_7'] / m['p50']:>6.2f}")
        ours, theirs = middle["pcieipc"], middle["MPI"]
        against = ours["p99_7"] / theirs["p99_7"]
        host = hit_by_gaps(gaps, ours["p50"], (tail_ratio - 1) * ours["p50"])
        floors = sides["floor"].get((size, "out_of_place"), [])
        if floors and len(floors) != repeat:
            raise Broken(f"floor: {len(floors)} runs of {size} B, not {repeat}")
        floor = ""
        if floors:
            f50, f997 = (statistics.median(run[stat] for run in floors) for stat in ("p50", "p99_7"))
            floor = f" | {f50:>10.2f} {f997:>8.2f} {f997 / f50:>6.2f}"
        print(f"{size:>12} {placement.replace('_', ' '):>12} {ours['calls']:>6g} |{cells[0]} |{cells[1]} | "
              f"{against:>19.2f} | {host * 100:>5.2f}%{floor}")
        where = f"{size} B {placement.replace('_', ' ')}"
        if against > 1.0:
            behind.append(f"{where}: p99.7 {ours['p99_7']:.2f} us against MPI's {theirs['p99_7']:.2f}")
        if size <= tail_up_to and ours["p99_7"] > tail_ratio * ours["p50"]:
            why = f", the host's gaps alone hit {host * 100:.2f}% of such calls" if host > 0.003 else ""
            behind.append(f"{where}: p99.7 {ours['p99_7'] / ours['p50']:.2f} times p50 (at most {tail_ratio:g}){why}")
    if not behind:
        return 0
    print("\n# FAILED: pcieipc's tail is over its goal: " + "; ".join(behind))
    open(f"{work}/behind", "w").write("\n".join(behind))
    return BEHIND


# --- scripts/bench-vs-nccl.sh -----------------------------------------------

def nccl_report(work, repeat, n, baseline=False):
    """bench-vs-nccl.sh's table: per size the best of the runs, busbw and time."""
    sides = {"pcieipc": [], "baseline": [], "NCCL": []}
    # Run by run, as the runs were made: the first with wrong values stops it.
    for run in range(1, repeat + 1):
        sides["pcieipc"].append(checked(pcieipc_output(f"{work}/pcieipc-{run}.json"), "pcieipc"))
        if baseline:
            sides["baseline"].append(checked(pcieipc_output(f"{work}/baseline-{run}.json"), "baseline"))
        sides["NCCL"].append(nccl_output(f"{work}/nccl-{run}.jsonl"))
    pcieipc, base, nccl = (by_size(outputs) for outputs in sides.values())

    def cell(size, rows, at):
        us = best(rows, at)
        return f"{size / us / 1e3 * 2 * (n - 1) / n:8.2f} {us:9.1f}"

    print(f"# {n} GPUs, float sum, best of {repeat}: busbw GB/s and time us")
    if not baseline:
        print(f"{'size (B)':>12}  {'pcieipc out-of-place':>20}  {'pcieipc in-place':>20}  {'NCCL in-place':>20}")
        for size in sorted(set(pcieipc) & set(nccl)):
            print(f"{size:>12}  {cell(size, pcieipc[size], TIME_OOP):>20}  {cell(size, pcieipc[size], TIME_IP):>20}  "
                  f"{cell(size, nccl[size], TIME_IP):>20}")
        return 0
    # ratio = pcieipc's busbw / the baseline's (the baseline's time / pcieipc's): below 1, slower than before.
    print(f"{'size (B)':>12}  {'pcieipc out-of-place':>20}  {'baseline out-of-place':>21}  {'ratio':>5}  "
          f"{'pcieipc in-place':>20}  {'baseline in-place':>20}  {'ratio':>5}  {'NCCL in-place':>20}")
    ratios = []
    for size in sorted(set(pcieipc) & set(base) & set(nccl)):
        ours, before = pcieipc[size], base[size]
        r_oop, r_ip = (best(before, at) / best(ours, at) for at in TIMES)
        ratios += [r_oop, r_ip]
        print(f"{size:>12}  {cell(size, ours, TIME_OOP):>20}  {cell(size, before, TIME_OOP):>21}  {r_oop:>5.2f}  "
              f"{cell(size, ours, TIME_IP):>20}  {cell(size, before, TIME_IP):>20}  {r_ip:>5.2f}  "
              f"{cell(size, nccl[size], TIME_IP):>20}")
    if not ratios:
        raise Broken("no size that pcieipc, the baseline and NCCL all ran")
    print(f"# lowest ratio pcieipc / baseline: {min(ratios):.2f} (of bests)")
    return 0


# --- scripts/bench-cuda-one-gpu.sh -----------------------------------------

CUDA_COLUMNS = ("time_us", "busbw_gb_s", "link_utilisation")


def cuda_output(file, label):
    """One `pcieipc bench --transport cuda --json` run: {size: (out of place's
    time, busbw and link use, then in place's)}, link use None where calls do
    not cross to the host; its path; its busiest link's limit (GB/s each
    way) or None."""
    if not os.path.exists(file):
        raise Broken(f"{label}: no {os.path.basename(file)} (that run was not made)")
    report = json.load(open(file))
    if report["wrong"]:
        raise Broken(f"{label} bench reported {report['wrong']} wrong values")
    rows = {row["size_bytes"]: tuple(row[placement].get(column) for placement in ("out_of_place", "in_place")
                                     for column in CUDA_COLUMNS)
            for row in report["results"]}
    links = report.get("host_links")
    limit = min(link["limit_gb_s"] for link in links) if links else None
    return rows, report.get("path", report["transport"]), limit


def one_gpu_report(work, repeat, modes, baseline=False):
    """bench-cuda-one-gpu.sh's tables: per mode and size the medians of the
    runs, with the link's limit and each size's use of it through host
    memory, and with a baseline the ratio of the median times (the
    baseline's over pcieipc's: below 1, slower than before)."""
    for mode in modes:
        sides = {"pcieipc": [], "baseline": []}
        for run in range(1, repeat + 1):
            for side in sides if baseline else ("pcieipc",):
                sides[side].append(cuda_output(f"{work}/{side}-{mode}-{run}.json", side))
        ours = by_size(rows for rows, _, _ in sides["pcieipc"])
        before = by_size(rows for rows, _, _ in sides["baseline"])
        print(f"# {mode}: {sides['pcieipc'][0][1]}")
        for side, runs in sides.items():
            limits = [limit for _, _, limit in runs if limit is not None]
            if limits:
                print(f"# {side}: the link's limit {statistics.median(limits):.1f} GB/s each way "
                      f"(median of {', '.join(f'{limit:.1f}' for limit in limits)})")

        def cells(rows, at):
            time, busbw, use = (median(rows, at + k) if rows[0][at + k] is not None else None for k in range(3))
            return f"{time:10.2f} {busbw:8.2f} " + (f"{use:5.2f}" if use is not None else f"{'-':>5}")

        header = f"{'size (B)':>12}  {'oop: us':>10} {'GB/s':>8} {'use':>5}  {'ip: us':>10} {'GB/s':>8} {'use':>5}"
        was = f"  {'was oop':>10} {'GB/s':>8} {'use':>5}  {'ratio':>5}  {'was ip':>10} {'GB/s':>8} {'use':>5}  {'ratio':>5}"
        print(header + (was if baseline else ""))
        ratios = []
        for size in sorted(set(ours) & set(before) if baseline else ours):
            line = f"{size:>12}  {cells(ours[size], 0)}  {cells(ours[size], 3)}"
            if baseline:
                r_oop, r_ip = (median(before[size], at) / median(ours[size], at) for at in (0, 3))
                ratios += [r_oop, r_ip]
                line += f"  {cells(before[size], 0)}  {r_oop:5.2f}  {cells(before[size], 3)}  {r_ip:5.2f}"
            print(line)
        if baseline:
            if not ratios:
                raise Broken(f"{mode}: no size that pcieipc and the baseline both ran")
            print(f"# {mode}: lowest ratio pcieipc / baseline {min(ratios):.2f}, highest {max(ratios):.2f} (of medians)")
    return 0


# --- scripts/bench-trace-overhead.sh ----------------------------------------

def trace_overhead_report(work, repeat):
    """bench-trace-overhead.sh's table: per size the medians of the build
    without tracing code, tracing off and tracing on, and the speed of the
    latter two against the first."""
    base, off, on = (medians(by_size(pcieipc_output(f"{work}/{name}-{run}.out").rows for run in range(1, repeat + 1)))
                     for name in ("baseline", "off", "on"))
    print(f"# medians of {repeat} alternating rounds; busbw GB/s out of place / in place (8 B: time in µs);")
    print("# off/none, on/none: speed against the build without tracing code (above 1: faster)")
    print(f"{'size':>10} {'no tracing code':>20} {'tracing off':>20} {'tracing on':>20} {'off/none':>9} {'on/none':>9}")
    for size in sorted(base):
        # 8 B: the times; above, the busbw.
        oop, ip = TIMES if size == 8 else (BUSBW_OOP, BUSBW_IP)
        b, f, n = base[size], off[size], on[size]

        def cell(r):
            return f"{r[oop]:.2f} / {r[ip]:.2f}"

        # Speed relative to no tracing code (above 1: faster): bandwidths
        # divide one way, the 8-byte times the other.
        def ratio(r):
            return ((r[oop] + r[ip]) / (b[oop] + b[ip])) ** (-1 if size == 8 else 1)

        print(f"{size:>10} {cell(b):>20} {cell(f):>20} {cell(n):>20} {ratio(f):>9.3f} {ratio(n):>9.3f}")
    return 0


# --- scripts/bench-ddp.sh ---------------------------------------------------

def ddp_report(runs_file):
    """Per backend, in the order they first ran, the median of its runs'
    median step times, printed as the run printed it (of an even count, the
    lower of the middle two)."""
    times = {}
    for line in open(runs_file):
        match = re.match(r"run \d+: (\S+) (\S+)$", line.strip())
        if match:
            times.setdefault(match.group(1), []).append(match.group(2))
    for backend, values in times.items():
        print(f"median: {backend} {sorted(values, key=float)[(len(values) - 1) // 2]} ms")
    return 0


# --- The command line -------------------------------------------------------

def parser():
    summary, _usage, layout = __doc__.split("\n\n", 2)
    top = argparse.ArgumentParser(description=summary, epilog=layout,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--self-test", action="store_true", help="run the fixture tests (tests/fixtures/bench)")
    sub = top.add_subparsers(dest="command")

    mpi = sub.add_parser("mpi", help="scripts/bench-vs-mpi.sh's report; exit 3 when behind MPI")
    mpi.add_argument("work")
    mpi.add_argument("--repeat", type=int, default=5, help="busbw runs per size and side (REPEAT)")
    mpi.add_argument("--latency-repeat", type=int, help="8-byte runs per side (LATENCY_REPEAT; default 3 * repeat)")
    mpi.add_argument("--steal-retries", type=int, default=3, help="remakes the script allowed a run (STEAL_RETRIES)")
    mpi.add_argument("--baseline", action="store_true", help="baseline-* runs are there (BASELINE=)")
    mpi.add_argument("--relay", action="store_true", help="relay-* runs are there (RELAY=1)")
    mpi.set_defaults(run=lambda a: mpi_report(a.work, a.repeat, a.latency_repeat or 3 * a.repeat,
                                              a.steal_retries, a.baseline, a.relay))

    timed = sub.add_parser("timed-ms", help="ms a run's timed calls took (pcieipc's JSON report or MPI's lines)")
    timed.add_argument("file")
    timed.add_argument("calls", type=int)
    timed.set_defaults(run=lambda a: print(timed_ms(a.file, a.calls)) or 0)

    cold = sub.add_parser("cold-start", help="scripts/cold-start-vs-mpi.sh's table; exit 3 when pcieipc takes "
                                             "more calls to steady than --at-most")
    cold.add_argument("work")
    cold.add_argument("--repeat", type=int, default=3, help="runs per side (REPEAT)")
    cold.add_argument("--at-most", type=int, default=5, help="calls to steady pcieipc may take (AT_MOST)")
    cold.set_defaults(run=lambda a: cold_start_report(a.work, a.repeat, a.at_most))

    latency = sub.add_parser("latency", help="scripts/latency-vs-mpi.sh's table; exit 3 when pcieipc's tail is "
                                             "over its goal")
    latency.add_argument("work")
    latency.add_argument("--repeat", type=int, default=3, help="runs per size and side (REPEAT)")
    latency.add_argument("--tail-ratio", type=float, default=1.5, help="p99.7 / p50 pcieipc may reach (TAIL_RATIO)")
    latency.add_argument("--tail-up-to", type=int, default=1 << 20,
                         help="the largest size the ratio applies to (TAIL_UP_TO)")
    latency.set_defaults(run=lambda a: latency_report(a.work, a.repeat, a.tail_ratio, a.tail_up_to))

    nccl = sub.add_parser("nccl", help="scripts/bench-vs-nccl.sh's table")
    nccl.add_argument("work")
    nccl.add_argument("--ngpus", type=int, required=True)
    nccl.add_argument("--repeat", type=int, default=3)
    nccl.add_argument("--baseline", action="store_true", help="baseline-RUN.json are there (BASELINE=)")
    nccl.set_defaults(run=lambda a: nccl_report(a.work, a.repeat, a.ngpus, a.baseline))

    nccl_latency = sub.add_parser("nccl-latency", help="scripts/bench-vs-nccl.sh LATENCY=1's table")
    nccl_latency.add_argument("work")
    nccl_latency.add_argument("--repeat", type=int, default=3)
    nccl_latency.set_defaults(run=lambda a: nccl_latency_report(a.work, a.repeat))

    one_gpu = sub.add_parser("one-gpu", help="scripts/bench-cuda-one-gpu.sh's tables")
    one_gpu.add_argument("work")
    one_gpu.add_argument("--repeat", type=int, default=3)
    one_gpu.add_argument("--modes", default="gpu host-memory host", help="the modes run (MODES)")
    one_gpu.add_argument("--baseline", action="store_true", help="baseline-MODE-RUN.json are there (BASELINE=)")
    one_gpu.set_defaults(run=lambda a: one_gpu_report(a.work, a.repeat, a.modes.split(), a.baseline))

    trace = sub.add_parser("trace-overhead", help="scripts/bench-trace-overhead.sh's table")
    trace.add_argument("work")
    trace.add_argument("--repeat", type=int, default=5)
    trace.set_defaults(run=lambda a: trace_overhead_report(a.work, a.repeat))

    ddp = sub.add_parser("ddp", help="scripts/bench-ddp.sh's medians")
    ddp.add_argument("runs", help='the script\'s "run N: BACKEND MS" lines')
    ddp.set_defaults(run=lambda a: ddp_report(a.runs))
    return top


def main(argv=None):
    top = parser()
    args = top.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.command is None:
        top.error("a subcommand or --self-test is needed")
    try:
        return args.run(args)
    except Broken as error:
        print(error, file=sys.stderr)
        return 1


# --- --self-test: tests/fixtures/bench --------------------------------------

def self_test():
    """Each fixture directory through its subcommand, on a copy (mpi writes
    `behind`): the values in the output, the exit status, and the whole
    output against expected*.txt, which the scripts' inline Python printed
    for the same fixtures before it moved here (tests/fixtures/bench/README.md)."""
    failures = []

    def expect(label, got, wanted):
        if got != wanted:
            failures.append(f"{label}: got {got!r}, expected {wanted!r}")

    @contextlib.contextmanager
    def copied(fixture):
        """A copy of the fixture directory to write in, gone afterwards."""
        with tempfile.TemporaryDirectory() as temp:
            work = os.path.join(temp, fixture)
            shutil.copytree(os.path.join(FIXTURES, fixture), work)
            yield work

    def run(fixture, command, *options):
        with copied(fixture) as work:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = main([command, work, *options])
            behind = os.path.join(work, "behind")
            behind = open(behind).read() if os.path.exists(behind) else None
        # Without jsonschema the mpi report says so first; the rest is the same.
        lines = [line for line in out.getvalue().splitlines() if not line.startswith("# bench JSON not validated")]
        return status, lines, err.getvalue(), behind

    def raises(label, call, message):
        try:
            call()
            failures.append(f"{label}: no error")
        except Broken as error:
            expect(label, str(error), message)

    def has(label, lines, line):
        if line not in lines:
            failures.append(f"{label}: no line {line!r} in:\n" + "\n".join(lines))

    def same_as(label, lines, fixture, expected):
        wanted = open(os.path.join(FIXTURES, fixture, expected)).read().splitlines()
        if lines != wanted:
            failures.append(f"{label}: differs from {fixture}/{expected}:\n" + "\n".join(lines))

    # OpenMPI, pcieipc ahead (hand-made, REPEAT=3): medians and bests of three,
    # the set-aside run unread, exit 0.
    status, lines, err, behind = run("mpi-ahead", "mpi", "--repeat", "3", "--latency-repeat", "3")
    expect("mpi-ahead: exit status", (status, err, behind), (0, "", None))
    has("mpi-ahead: 8 B medians (bests)", lines, "         8 B    0.30 (0.25)     0.36 (0.35)     0.28 (0.27)     0.33 (0.31)")
    has("mpi-ahead: busbw medians 6/4 and 9/6, bests 7/5 and 10/6, host 6.0 (5.0-7.0)", lines,
        "       65536          6.00      4.00   1.50         9.00      6.00   1.50   |           1.40      1.67 | 6.0 (5.0-7.0)")
    has("mpi-ahead: lowest ratio", lines, "# lowest ratio: 1.50 of medians, 1.40 of bests")
    has("mpi-ahead: low tail", lines,
        "# pcieipc's runs below MPI's median busbw: at most 1 of 3 at one size (65536 B out of place)")
    has("mpi-ahead: steal", lines, "#    pcieipc     6 kept    1 remade    0 over      12 ms")
    same_as("mpi-ahead", lines, "mpi-ahead", "expected.txt")
    # The gate on latency alone: MPI's medians measured as if they were
    # pcieipc's are behind pcieipc's, in and out of place.
    work = os.path.join(FIXTURES, "mpi-ahead")
    mpi8 = by_size(mpi_output(file) for file in run_files(work, "mpi-8", 3, "txt"))
    ours8 = by_size(pcieipc_output(file).rows for file in run_files(work, "pcieipc-8", 3, "json"))
    expect("mpi-ahead: latency gate, MPI taken as pcieipc", latency_behind(mpi8, ours8),
           ["8 B out of place: 0.36 us against 0.30", "8 B in place: 0.33 us against 0.28"])
    expect("mpi-ahead: latency gate", latency_behind(ours8, mpi8), [])
    # timed-ms: 1000 calls of (18.72 + 7.28) us (3.5 and 9 GB/s at 64 KiB),
    # and of MPI's (16.38 + 10.92) us.
    expect("timed-ms of a JSON report", timed_ms(os.path.join(work, "pcieipc-1.65536.json"), 1000), 26)
    expect("timed-ms of MPI's lines", timed_ms(os.path.join(work, "mpi-1.65536.txt"), 1000), 27)

    # OpenMPI, a real run with BASELINE and RELAY=1 (REPEAT=2): medians of two,
    # behind at 131072 B: exit 3 and the reason in `behind`.
    status, lines, err, behind = run("mpi-behind", "mpi", "--repeat", "2", "--latency-repeat", "2",
                                     "--baseline", "--relay")
    expect("mpi-behind: exit status when behind", (status, err, behind), (BEHIND, "", "busbw: lowest median ratio 0.41"))
    has("mpi-behind: a median of two is their mean", lines,
        "      131072          2.01      4.94   0.41         9.01      4.81   1.87   |           0.59      1.81 | 6.0 (6.0-6.0)")
    has("mpi-behind: FAILED", lines, "# FAILED: pcieipc's median is behind MPI's: busbw: lowest median ratio 0.41")
    same_as("mpi-behind", lines, "mpi-behind", "expected.txt")

    # NCCL (hand-made, 2 GPUs, REPEAT=3): bests, busbw from the time; behind
    # NCCL at 2 MiB and the baseline's run faster: no gate, exit 0.
    status, lines, err, _ = run("nccl", "nccl", "--repeat", "3", "--ngpus", "2")
    expect("nccl: exit status", (status, err), (0, ""))
    has("nccl: bests 40/50 us at 2 MiB, NCCL 35", lines,
        "     2097152       52.43      40.0       41.94      50.0       59.92      35.0")
    same_as("nccl", lines, "nccl", "expected.txt")
    status, lines, err, _ = run("nccl", "nccl", "--repeat", "3", "--ngpus", "2", "--baseline")
    expect("nccl --baseline: exit status", (status, err), (0, ""))
    has("nccl --baseline: ratio = baseline's best time / pcieipc's", lines,
        "           8        0.00      30.0         0.00      24.0   0.80        0.00      32.0        0.00      32.0   1.00"
        "        0.00      40.0")
    has("nccl --baseline: lowest ratio", lines, "# lowest ratio pcieipc / baseline: 0.80 (of bests)")
    same_as("nccl --baseline", lines, "nccl", "expected-baseline.txt")
    status, lines, err, _ = run("wrong", "nccl", "--repeat", "1", "--ngpus", "2")
    expect("wrong: a pcieipc run that found wrong values", (status, err), (1, "pcieipc bench reported 4 wrong values\n"))
    raises("wrong: NCCL's wrong values", lambda: nccl_output(os.path.join(FIXTURES, "wrong", "nccl-1.jsonl")),
           "NCCL all_reduce gave 3 wrong values")

    # NCCL's per-call times (real runs, REPEAT=2: pcieipc's shm bench and
    # bench/nccl_allreduce.py on Gloo, which print what the GPU runs print):
    # medians of two, the library's own lines passed over.
    status, lines, err, _ = run("nccl-latency", "nccl-latency", "--repeat", "2")
    expect("nccl-latency: exit status", (status, err), (0, ""))
    same_as("nccl-latency", lines, "nccl-latency", "expected.txt")
    runs = [distribution(calls) for file in run_files(os.path.join(FIXTURES, "nccl-latency"), "nccl", 2, "jsonl")
            for calls in mpi_calls(file).values()]
    expect("nccl-latency: 4 sizes of 50 calls a run", [run["calls"] for run in runs], [50] * 8)
    with copied("nccl-latency") as work:
        with open(os.path.join(work, "nccl-2.jsonl"), "w") as file:
            file.writelines(line for line in open(os.path.join(FIXTURES, "nccl-latency", "nccl-2.jsonl"))
                            if not line.startswith("calls "))
        raises("nccl-latency: an NCCL run without --latency", lambda: nccl_latency_report(work, 2),
               'nccl-2.jsonl: no "calls" lines (a run without --latency)')

    # One GPU (hand-made, REPEAT=3): medians of three per mode, the link's
    # limit and use through host memory, none peer to peer; ratios of the
    # median times to the baseline's.
    status, lines, err, _ = run("one-gpu", "one-gpu", "--repeat", "3", "--modes", "host-memory gpu", "--baseline")
    expect("one-gpu: exit status", (status, err), (0, ""))
    has("one-gpu: the limits, medians of three", lines,
        "# pcieipc: the link's limit 50.0 GB/s each way (median of 50.6, 50.0, 49.0)")
    has("one-gpu: 128 MiB through host: median times 6500/6490 against 9500/9400, use 0.82 against 0.56", lines,
        "   134217728     6500.00    20.65  0.82     6490.00    20.68  0.82     9500.00    14.13  0.56   1.46"
        "     9400.00    14.28  0.56   1.45")
    has("one-gpu: peer to peer, no link use", lines,
        "           8       11.00     0.00     -       11.20     0.00     -       10.00     0.00     -   0.91"
        "       11.20     0.00     -   1.00")
    has("one-gpu: lowest and highest ratio", lines, "# gpu: lowest ratio pcieipc / baseline 0.91, highest 1.02 (of medians)")
    same_as("one-gpu --baseline", lines, "one-gpu", "expected-baseline.txt")
    status, lines, err, _ = run("one-gpu", "one-gpu", "--repeat", "3", "--modes", "host")
    expect("one-gpu: a mode that was not run", (status, err), (1, "pcieipc: no pcieipc-host-1.json (that run was not made)\n"))
    raises("one-gpu: a run's wrong values", lambda: cuda_output(os.path.join(FIXTURES, "wrong", "pcieipc-1.json"), "pcieipc"),
           "pcieipc bench reported 4 wrong values")

    # Tracing (hand-made text tables, REPEAT=3): medians of three, 8 B by time.
    status, lines, err, _ = run("trace-overhead", "trace-overhead", "--repeat", "3")
    expect("trace-overhead: exit status", (status, err), (0, ""))
    has("trace-overhead: 8 B, times 0.40/0.30, 0.40/0.40, 0.80/0.60", lines,
        "         8          0.40 / 0.30          0.40 / 0.40          0.80 / 0.60     0.875     0.500")
    has("trace-overhead: 8 MiB, busbw 8/9, 7/9, 8.5/8.5", lines,
        "   8388608          8.00 / 9.00          7.00 / 9.00          8.50 / 8.50     0.941     1.000")
    same_as("trace-overhead", lines, "trace-overhead", "expected.txt")

    # Cold start (a real run, REPEAT=3): the rule on a hand-made list, then
    # the run: over 5 calls to steady at 16 and 32 MiB, exit 3.
    expect("to_steady: the last quarter's median, the first call within 10%",
           to_steady([900.0, 300.0, 109.0, 100.0, 120.0, 100.0, 95.0, 100.0]), (100.0, 3))
    expect("to_steady: none within 10% of the tail counts every call",
           to_steady([9.0, 9.0, 9.0, 1.0]), (1.0, 4))
    status, lines, err, behind = run("cold-start", "cold-start", "--repeat", "3")
    expect("cold-start: exit status when over", (status, err, behind),
           (BEHIND, "", "16777216 B: 13 calls to steady (at most 5)\n33554432 B: 8 calls to steady (at most 5)"))
    has("cold-start: 64 KiB medians", lines,
        "       65536        396.0          9.0      3  |        154.3         19.8      2  |                2")
    same_as("cold-start", lines, "cold-start", "expected.txt")
    status, lines, err, behind = run("cold-start", "cold-start", "--repeat", "3", "--at-most", "13")
    expect("cold-start --at-most 13: exit status", (status, err, behind), (0, "", None))

    # Latency (a real run, REPEAT=2): the percentiles' rule on 1..1000 us
    # (as bench_latency.rs's test), then the run: pcieipc's p99.7 at most
    # MPI's everywhere, but over 1.5 times its p50 at three of four rows.
    expect("distribution: nearest-rank percentiles of 1..1000",
           {k: v for k, v in distribution([float(us) for us in range(1000, 0, -1)]).items() if k != "stddev"},
           {"p50": 500.0, "p90": 900.0, "p99": 990.0, "p99_7": 997.0, "max": 1000.0, "mean": 500.5, "calls": 1000})
    expect("distribution: few calls make p99.7 the maximum",
           [distribution([3.0, 1.0, 2.0, 10.0])[k] for k in ("p50", "p90", "p99_7")], [2.0, 10.0, 10.0])
    status, lines, err, behind = run("latency", "latency", "--repeat", "2")
    expect("latency: exit status when over", (status, err, behind),
           (BEHIND, "", "8 B out of place: p99.7 54.38 us against MPI's 0.75\n"
                        "8 B out of place: p99.7 124.15 times p50 (at most 1.5)\n"
                        "512 B in place: p99.7 8.52 us against MPI's 5.37\n"
                        "512 B in place: p99.7 11.10 times p50 (at most 1.5)"))
    has("latency: 512 B out of place, medians of two, the host's gaps and the C floor beside it", lines,
        "         512 out of place    400 |        0.77     1.07     1.15      5.4    0.253   1.49 |"
        "        0.96     1.19     3.41     18.2    0.889   3.57 |                0.34 |  0.13% |"
        "       0.66     1.42   2.17")
    has("latency: CPU 1's gaps", lines,
        "# host: CPU 1 lost 1.81% of 0.4 s to 990 gaps a second over 1 us (380 over 10 us, the longest 945 us)")
    same_as("latency", lines, "latency", "expected.txt")
    # The same pcieipc runs against an MPI taking 1 ms a call, and a tail
    # goal of 200: nothing over, exit 0.
    with copied("latency") as work:
        for file in glob.glob(f"{work}/mpi-*.txt"):
            size = os.path.basename(file).split(".")[1]
            open(file, "w").write("".join(f"calls {size} {p} " + " ".join(["1000"] * 400) + "\n" for p in ("oop", "ip")))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = main(["latency", work, "--repeat", "2", "--tail-ratio", "200"])
        expect("latency against a slower MPI, --tail-ratio 200: exit status",
               (status, os.path.exists(os.path.join(work, "behind"))), (0, False))
    # Where the host's gaps explain the tail, the reason says so: CPUs
    # losing 1000 gaps of 20 us a second hit 2% of 10 us calls.
    gaps = {"0": ([20.0] * 500, 1.0), "1": ([20.0] * 500, 1.0)}
    expect("hit_by_gaps: 1000 gaps a second over 10 us calls", round(hit_by_gaps(gaps, 10.0, 5.0), 6), 0.01)
    expect("hit_by_gaps: gaps shorter than asked count not", hit_by_gaps(gaps, 10.0, 25.0), 0.0)

    # DDP (hand-made, REPEAT=4): the lower of the middle two, as printed.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["ddp", os.path.join(FIXTURES, "ddp", "runs.txt")])
    expect("ddp", (status, out.getvalue().splitlines()),
           (0, ["median: gloo 3.300 ms", "median: pcieipc 1.320 ms", "median: pcieipc-hook 0.960 ms"]))

    for failure in failures:
        print(f"bench_compare self-test: {failure}", file=sys.stderr)
    if failures:
        return 1
    print("bench_compare self-test: OpenMPI (ahead, and behind: exit 3), NCCL (with and without a baseline, "
          "wrong values, per call), one GPU's CUDA paths, cold start, latency, tracing overhead and DDP fixtures give their "
          "medians, bests, ratios and exit status")
    return 0


if __name__ == "__main__":
    sys.exit(main())
