"""The outbox SLO metrics of live relays, both modes: the dwell histogram per topic and rows per harvest
transaction, scraped over real HTTP from relays on the real Postgres and Kafka; and the shipped Grafana
dashboard (docs/grafana/harvest-dashboard.json) and alert rules (docs/prometheus/harvest-alerts.yml, which
docs/health.md copies) name only metrics such a relay exports: renaming a metric fails here."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from relaylib import relay_config, wait_drained

from harvest_outbox.producer.harvest import Harvest
from harvest_outbox.producer.schema.ddl import init_db
from harvest_outbox.producer.stash.stasher import OutboxRecord, Stasher

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "docs" / "grafana" / "harvest-dashboard.json"
RULES = ROOT / "docs" / "prometheus" / "harvest-alerts.yml"
README = ROOT / "docs" / "health.md"  # the alerts page, which shows the rules file verbatim
# The dwell histogram's buckets (le, as Prometheus shows them): 1 ms to 5 minutes.
DWELL_LE = (
    "0.001",
    "0.0025",
    "0.005",
    "0.01",
    "0.025",
    "0.05",
    "0.1",
    "0.25",
    "0.5",
    "1.0",
    "2.5",
    "5.0",
    "10.0",
    "30.0",
    "60.0",
    "120.0",
    "300.0",
)

# A metric name in PromQL: harvest_… not preceded by a name character (quoted label values are blanked first).
_METRIC = re.compile(r"(?<![\w:])harvest_[A-Za-z0-9_:]*")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')


def metric_names(expr: str) -> set[str]:
    """The ``harvest_`` series names an expression reads (``…_bucket``/``_sum``/``_count``/``_total`` as written:
    Prometheus stores a histogram or counter under those names, so they are what a scrape must show)."""
    return set(_METRIC.findall(_QUOTED.sub('""', expr)))


def dashboard_exprs(node: Any) -> Iterator[str]:
    """Every PromQL text of a Grafana dashboard: panel targets' ``expr`` and template variables' queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, str) and "harvest_" in value:
                yield value
            else:
                yield from dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_exprs(item)


def rule_exprs(rules: dict[str, Any]) -> list[str]:
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def readme_rules() -> str:
    block = README.read_text().split("<!-- alerts:begin -->\n")[1].split("<!-- alerts:end -->")[0]
    assert block.startswith("```yaml\n") and block.endswith("```\n"), "docs/health.md's alert block is one yaml fence"
    return block[len("```yaml\n") : -len("```\n")]


@pytest.mark.parametrize(
    "expr, names",
    [
        (
            "histogram_quantile(0.99, sum by (job, topic, le) (rate(harvest_dwell_seconds_bucket[5m]))) > 10",
            {"harvest_dwell_seconds_bucket"},
        ),
        ('max by (job) (harvest_backlog_rows{job=~"$job", relay="harvest_a"})', {"harvest_backlog_rows"}),
        (
            "sum(rate(harvest_transaction_rows_sum[$__rate_interval])) / sum(rate(harvest_transaction_rows_count[1m]))",
            {"harvest_transaction_rows_sum", "harvest_transaction_rows_count"},
        ),
        ("label_values(harvest_is_leader, job)", {"harvest_is_leader"}),
        ("sum by (job) (harvest_is_leader) < 1 or absent(harvest_is_leader)", {"harvest_is_leader"}),
        ("my_harvest_rows + up", set()),
    ],
)
def test_metric_names_are_read_out_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_readme_alerts_are_the_rules_file() -> None:
    """One owner: docs/prometheus/harvest-alerts.yml; docs/health.md shows it verbatim."""
    assert readme_rules() == RULES.read_text(), (
        "copy docs/prometheus/harvest-alerts.yml into docs/health.md's alerts block"
    )


def test_the_rules_and_the_dashboard_cover_the_slos() -> None:
    rules = yaml.safe_load(RULES.read_text())
    by_name = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert all({"alert", "expr"} <= set(r) for r in by_name.values())
    assert by_name["HarvestDwellP99"]["expr"].startswith("histogram_quantile(0.99, ")
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {p["title"]: p for p in dashboard["panels"]}
    for title in titles.values():
        assert title["targets"] and all(metric_names(t["expr"]) for t in title["targets"]), title["title"]
    used = set().union(*map(metric_names, dashboard_exprs(dashboard)))
    for metric in (
        "harvest_backlog_rows",
        "harvest_oldest_unsent_age_seconds",
        "harvest_dwell_seconds_bucket",
        "harvest_delivered_records_total",
        "harvest_dead_letter_rows",
        "harvest_is_leader",
        "harvest_transaction_rows_bucket",
    ):
        assert metric in used, f"the dashboard shows no {metric}"


def scrape(relay: Harvest) -> dict[str, Any]:
    """``{family name: family}`` of the relay's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{relay.prometheus_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def histogram(families: dict[str, Any], name: str, **labels: str) -> dict[str, float]:
    """``{le: cumulative count, "sum": …, "count": …}`` of one labelled histogram."""
    assert name in families, f"/metrics exports no {name}"
    out: dict[str, float] = {}
    for s in families[name].samples:
        if all(s.labels.get(k) == v for k, v in labels.items()):
            key = s.labels["le"] if s.name.endswith("_bucket") else s.name.rsplit("_", 1)[1]
            out[key] = s.value
    return out


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.integration
@pytest.mark.parametrize("sequenced", [False, True], ids=["at_least_once", "sequenced"])
def test_live_relay_exports_dwell_and_every_metric_the_dashboard_and_alerts_use(
    sequenced: bool,
    pg_dsn: str,
    kafka_bootstrap: str,
    pg_schema: str,
    topic_factory: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    table = f"{pg_schema}.outbox"
    init_db(pg_dsn, table)
    old, new = topic_factory(partitions=2, prefix="old"), topic_factory(partitions=2, prefix="new")
    stasher = Stasher(table)
    n_old, n_new = 20, 30
    # Rows committed 30 s ago (backdated before the relay starts): each dwells over 30 s.
    with psycopg.connect(pg_dsn) as conn:
        stasher.stash_many(conn, [OutboxRecord(old, f"k{i % 5}", f"v{i}") for i in range(n_old)])
        conn.execute(
            sql.SQL("UPDATE {} SET create_time = create_time - interval '30 seconds'").format(
                sql.Identifier(pg_schema, "outbox")
            )
        )
    backdated = time.monotonic()
    cfg = relay_config(pg_dsn, kafka_bootstrap, table, unique_name("g")).replace(
        prometheus_port=0,
        prometheus_bind_address="127.0.0.1",
        leader_election="postgres",
        leader_lock_check_interval=0.2,
        uuid_sequencing=sequenced,
    )
    relay = Harvest(cfg).start()
    try:
        wait_for("the relay to lead", lambda: relay.is_leader)
        started = time.monotonic()
        for i in range(n_new):  # a trickle: one row per transaction
            with psycopg.connect(pg_dsn) as conn:
                stasher.stash(conn, OutboxRecord(new, f"k{i % 5}", f"v{i}"))
        wait_drained(pg_dsn, table)
        name = relay.config.name

        def observed() -> dict[str, Any] | None:
            got = scrape(relay)
            counts = {t: histogram(got, "harvest_dwell_seconds", relay=name, topic=t).get("count") for t in (old, new)}
            return got if counts == {old: n_old, new: n_new} else None

        families = wait_for("every row's dwell observed once", observed)
        elapsed_new, elapsed_old = time.monotonic() - started, time.monotonic() - backdated
        h_old = histogram(families, "harvest_dwell_seconds", relay=name, topic=old)
        h_new = histogram(families, "harvest_dwell_seconds", relay=name, topic=new)
        assert set(h_old) == {*DWELL_LE, "+Inf", "sum", "count"}
        # backdated 30 s: over 30 s each, and at most the time since (plus the 30 s)
        assert h_old["30.0"] == 0 and h_old["+Inf"] == n_old
        assert 30 * n_old < h_old["sum"] <= (30 + elapsed_old) * n_old
        # trickled while the relay ran: positive, each at most the time since the first was written
        assert 0 < h_new["sum"] <= elapsed_new * n_new
        within = next(le for le in DWELL_LE if float(le) >= elapsed_new)
        assert h_new[within] == n_new
        cumulative = [h_new[le] for le in DWELL_LE]
        assert cumulative == sorted(cumulative)

        txn = histogram(families, "harvest_transaction_rows", relay=name)
        if sequenced:
            assert txn["sum"] == n_old + n_new and 1 <= txn["count"] <= n_old + n_new
        else:  # no harvest transactions: exported, empty
            assert txn["count"] == 0 and txn["sum"] == 0

        # Every series the dashboard and the alerts read is one this relay exports.
        exported = {s.name for f in families.values() for s in f.samples}
        used_by_dashboard = set().union(*map(metric_names, dashboard_exprs(json.loads(DASHBOARD.read_text()))))
        used_by_rules = set().union(*map(metric_names, rule_exprs(yaml.safe_load(RULES.read_text()))))
        assert used_by_dashboard and used_by_rules
        assert used_by_dashboard <= exported, f"the dashboard reads unknown metrics: {used_by_dashboard - exported}"
        assert used_by_rules <= exported, f"the alert rules read unknown metrics: {used_by_rules - exported}"
    finally:
        relay.stop()
        relay.wait(60)
