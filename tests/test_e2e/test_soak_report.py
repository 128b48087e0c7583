"""The soak's history and report (harvest_local/history.py, harvest_local/soak_report.py), on synthetic runs.

No services: histories are written with the real recorder into a soak folder, then read back and
reported: the parse (a line cut off by a kill skipped), the aggregate and the verdict (OK, FAIL on a
violation or an error, INCOMPLETE for a run cut short), each reader's lag, the Markdown table, fault lanes
whose labels never overlap, and the PNG itself.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from harvest_outbox.harvest_local import soak_report
from harvest_outbox.harvest_local._lanes import pack_lanes, place_labels
from harvest_outbox.harvest_local.history import FILE_NAME, History, read
from harvest_outbox.harvest_local.soak_report import load, max_lag, render, verdict

READER = "ReadCommittedIter -> Postgres"


def _clean(reader: str, expected: int) -> dict[str, object]:
    return {
        "reader": reader,
        "expected": expected,
        "delivered": expected,
        "lost": 0,
        "duplicates": 0,
        "order_violations": 0,
        "phantoms": 0,
    }


def _run(
    folder: Path,
    seed: int,
    t0: float,
    faults: list[tuple[str, str, float, float]],
    *,
    lost: int = 0,
    duplicates: int = 0,
    exactly_once: bool = True,
    ended: bool = True,
    error: str | None = None,
) -> History:
    """A 20-second run from ``t0``: 100 rows/s committed, the reader 2 s behind, one sample a second."""
    h = History(folder / str(seed) / FILE_NAME, seed)
    rec = h._write  # the recorder's times are time.time(); a synthetic run sets its own
    rec("run", t=t0, plan={"seed": seed, "layout": "cursor", "relays": 2, "partitions": 3, "brokers": 3})
    for kind, target, start, end in faults:
        h.fault(kind, target, t0 + start, t0 + end, f"{kind} on {target}")
    for s in range(21):
        rec("sample", t=t0 + s, committed=min(100 * s, 1800), backlog=50, readers={READER: max(100 * (s - 2), 0)})
    if ended:
        verdict = _clean(READER, 1800) | {"lost": lost, "duplicates": duplicates, "exactly_once": exactly_once}
        rec(
            "end",
            t=t0 + 21,
            ok=not lost and not (duplicates and exactly_once) and error is None,
            committed=1800,
            rolled_back=200,
            seconds=21.0,
            verdicts=[] if error else [verdict],
            injected={k: 1 for k, *_ in faults},
            notes=["killed relay-0"],
            error=error,
        )
    return h


def test_a_clean_soak_reads_back_with_its_lag_table_and_plot(tmp_path: Path) -> None:
    _run(tmp_path, 1, 1000.0, [("kill_leader", "relay-0", 5.0, 5.01), ("node_pause", "node 2", 8.0, 13.0)])
    _run(tmp_path, 2, 1030.0, [("two_nodes_down", "node 1, 3", 4.0, 10.0)])
    (tmp_path / "soak.json").write_text(json.dumps({"command": "./dev soak --runs 2"}))

    runs = load(tmp_path)
    assert [r.run for r in runs] == [1, 2]
    assert [f.kind for f in runs[0].faults] == ["kill_leader", "node_pause"]
    assert runs[0].faults[1].end - runs[0].faults[1].start == pytest.approx(5.0)
    assert runs[0].readers == [READER]
    assert max_lag(runs[0]) == {READER: 200}  # 2 s behind at 100 rows/s
    assert runs[0].lag(READER)[-1][1] == 0  # caught up at the end
    v = verdict(runs)
    assert (v.status, v.runs, v.clean, v.committed, v.rolled_back, v.reader_verdicts, v.violations) == (
        "OK",
        2,
        2,
        3600,
        400,
        2,
        0,
    )
    assert v.line().startswith("OK: 2 runs (2 clean), 3,600 rows committed (+400 rolled back)")

    md = render(runs, {"command": "./dev soak --runs 2"}, "timeline.png")
    rows = [line for line in md.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert len(rows) == 2
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[:5] == ["1", "cursor", "3", "2", "3"]
    assert cells[5] == "kill_leader relay-0 (5s), node_pause node 2 (8s)"
    assert cells[7:12] == ["1,800", "200", READER, "200", "OK"]
    assert "`./dev soak --runs 2`" in md and "![timeline" in md
    assert "None: every reader of every run" in md

    verdict_, report, png = soak_report.write(tmp_path)
    assert verdict_.ok and report.read_text().startswith("# Soak report")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert soak_report.main([str(tmp_path)]) == 0


def test_a_violation_an_error_and_a_run_cut_short_each_decide_the_verdict(tmp_path: Path) -> None:
    _run(tmp_path, 1, 1000.0, [("consumer_kill", "consumer", 3.0, 3.5)], lost=3)
    v = verdict(load(tmp_path))
    assert (v.status, v.clean, v.failed, v.violations) == ("FAIL", 0, 1, 3)
    md = render(load(tmp_path))
    assert f"  - {READER}: lost 3, duplicates 0, order 0, phantoms 0 (of 1800 expected)" in md
    assert soak_report.main([str(tmp_path)]) == 1

    cut = tmp_path / "cut"
    _run(cut, 5, 2000.0, [], ended=False)
    with (cut / "5" / FILE_NAME).open("a") as f:
        f.write('{"ev": "sample", "run": 5, "t": 20')  # the soak killed mid-write
    runs = load(cut)
    assert len(runs[0].samples) == 21 and runs[0].end is None
    assert runs[0].finished == 2020.0
    v = verdict(runs)
    assert (v.status, v.unfinished, v.clean) == ("INCOMPLETE", 1, 0)
    assert "| CUT SHORT |" in render(runs)
    assert soak_report.write(cut)[2].exists()  # a run without an end still draws

    errored = tmp_path / "errored"
    _run(errored, 7, 3000.0, [], error="TimeoutError('a relay to be elected leader')")
    v = verdict(load(errored))
    assert (v.status, v.failed, v.violations) == ("FAIL", 1, 0)
    assert "ERROR: TimeoutError" in render(load(errored))


@pytest.mark.parametrize(("exactly_once", "status"), [(True, "FAIL"), (False, "OK")])
def test_repeats_are_violations_only_where_the_run_promised_exactly_once(
    tmp_path: Path, exactly_once: bool, status: str
) -> None:
    """An at-least-once run (the relay without uuidSequencing) may repeat rows: counted, not a violation."""
    _run(tmp_path, 1, 1000.0, [("kill_leader", "relay-0", 5.0, 5.01)], duplicates=10, exactly_once=exactly_once)
    v = verdict(load(tmp_path))
    assert (v.status, v.violations) == (status, 10 if exactly_once else 0)
    md = render(load(tmp_path))
    assert (f"  - {READER}: lost 0, duplicates 10, order 0" in md) == exactly_once


def test_fault_labels_are_packed_into_lanes_that_never_overlap() -> None:
    spans = [(0.0, 10.0), (2.0, 4.0), (5.0, 6.0), (10.0, 12.0), (3.0, 30.0), (11.0, 11.5)]
    lanes = pack_lanes(spans)
    for i, (a0, a1) in enumerate(spans):
        for j, (b0, b1) in enumerate(spans):
            if i < j and lanes[i] == lanes[j]:
                assert a1 <= b0 or b1 <= a0, (spans[i], spans[j])
    assert lanes[0] == 0 and lanes[3] == 0  # a lane is reused once free
    assert max(lanes) == 2  # three spans overlap at t=3: three lanes, no more

    # a label that would run past the axis' right edge goes before its bar, and still overlaps nothing
    placed = place_labels([(0.0, 5.0, "a" * 10), (90.0, 5.0, "b" * 10), (60.0, 1.0, "c" * 10)], 1.0, 100.0)
    assert [(after, span) for _, after, span in placed] == [
        (True, (0.0, 17.0)),
        (False, (78.0, 95.0)),
        (True, (60.0, 73.0)),
    ]
    assert [lane for lane, _, _ in placed] == [0, 0, 0]
    assert place_labels([(50.0, 1.0, "x" * 10), (55.0, 1.0, "y")], 1.0, 100.0)[1][0] == 1  # overlapping: next lane


def test_many_faults_in_one_panel_get_distinct_lanes(tmp_path: Path) -> None:
    faults = [("pause_leader", f"relay-{i}", float(i), i + 7.0) for i in range(6)]
    _run(tmp_path, 3, 0.0, faults)
    runs = load(tmp_path)
    bars = soak_report._bars(runs, 0.0, 0.0, 30.0)
    assert [b.label for b in bars] == [f"pause_leader relay-{i}" for i in range(6)]
    assert len({b.lane for b in bars}) == 6  # each overlaps the next: six lanes
    assert soak_report.plot(runs, tmp_path / "t.png").exists()


def test_the_recorder_is_thread_safe_and_the_file_is_one_json_object_per_line(tmp_path: Path) -> None:
    h = History(tmp_path / "9" / FILE_NAME, 9)
    h.run_started({"seed": 9})

    def sample() -> None:
        for i in range(200):
            h.sample(i, None, {READER: i})

    threads = [threading.Thread(target=sample) for _ in range(4)]
    for t in threads:
        t.start()
    h.fault("kill_leader", "relay-1", 1.0, 1.0)
    for t in threads:
        t.join()
    lines = h.path.read_text().splitlines()
    assert len(lines) == 1 + 800 + 1
    assert all(json.loads(line)["run"] == 9 for line in lines)
    run = read(h.path)
    assert len(run.samples) == 800 and run.faults[0].target == "relay-1" and run.end is None


def test_a_folder_without_histories_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"holds no \*/history.jsonl.*run ./dev soak again"):
        load(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load(tmp_path / "nope")
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / FILE_NAME).write_text('{"ev": "sample", "run": 1}\n')
    with pytest.raises(ValueError, match="no run record"):
        load(tmp_path)
    assert soak_report.main([str(tmp_path / "nope")]) == 2


def test_a_cluster_faults_target_is_the_node_its_note_names() -> None:
    from harvest_outbox.harvest_local.faults import _fault_target

    assert _fault_target("node_kill", None, "killed Kafka node 2 (leader of partition 0), back after 2s") == "node 2"
    assert _fault_target("two_nodes_down", None, "killed Kafka nodes [1, 3] (no quorum), back after 6s") == "node 1, 3"
    assert _fault_target("postgres_restart", None, "restarted Postgres") == "Postgres"
    assert _fault_target("consumer_kill", None, "killed the consumer") == "consumer"
    assert _fault_target("some_new_kind", None, "cut relay-1 off from Kafka node 3 for 5s") == "node 3"
    assert _fault_target("another_kind", None, "failed Postgres over to its standby") == (
        "failed Postgres over to its standby"
    )


def test_the_sampler_leaves_out_a_failing_probe_and_records_a_last_sample_on_stop(tmp_path: Path) -> None:
    h = History(tmp_path / "4" / FILE_NAME, 4)
    h.run_started({"seed": 4})
    calls = {"n": 0}
    closed: list[bool] = []

    def flaky() -> int:
        calls["n"] += 1
        if calls["n"] % 2:
            raise OSError("database restarting")
        return 7 * calls["n"]

    sampler = h.sampler(
        lambda: 100, None, {READER: flaky, "other": lambda: 5}, every=0.05, on_stop=lambda: closed.append(True)
    )
    sampler.start()
    deadline = time.monotonic() + 10
    while len(read(h.path).samples) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    run = read(h.path)
    assert closed == [True]
    assert all(s.committed == 100 and s.backlog is None and s.readers["other"] == 5 for s in run.samples)
    with_reader = [s.readers[READER] for s in run.samples if READER in s.readers]
    assert 0 < len(with_reader) < len(run.samples)  # the failing reads are left out, never recorded as 0
    assert 0 not in with_reader
    assert run.lag(READER) == [(s.t, 100 - s.readers[READER]) for s in run.samples if READER in s.readers]


@pytest.mark.integration
@pytest.mark.parametrize("layout", ["mark", "cursor"])
def test_table_counts_read_the_outbox_backlog_and_a_readers_table_and_reconnect(
    pg_dsn: str, pg_schema: str, layout: str
) -> None:
    import psycopg

    from harvest_outbox.harvest_local.applier import create_tables
    from harvest_outbox.harvest_local.history import TableCounts
    from harvest_outbox.harvest_local.workload import create_accounts, stash_backlog
    from harvest_outbox.producer.schema.ddl import init_db

    outbox = f"{pg_schema}.outbox"
    create_accounts(pg_dsn, pg_schema, 5)
    init_db(pg_dsn, outbox, layout=layout, **({"partition_ids": 1000} if layout == "cursor" else {}))
    create_tables(pg_dsn, pg_schema)
    counts = TableCounts(pg_dsn)
    try:
        assert counts.backlog(outbox, layout) == 0
        stash_backlog(pg_dsn, pg_schema, outbox, "t", keys=5, rows=120)
        assert counts.backlog(outbox, layout) == 120  # no relay runs: every committed row waits
        assert counts.rows(pg_schema, "applied") == 0
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the probe's session ended, as by a restart
            ended = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'harvest-history' AND query LIKE %s",
                (f"%{pg_schema}%",),
            ).fetchall()
        assert ended == [(True,)]
        with pytest.raises(psycopg.Error):
            counts.rows(pg_schema, "applied")
        assert counts.rows(pg_schema, "applied") == 0  # a new connection
    finally:
        counts.close()
