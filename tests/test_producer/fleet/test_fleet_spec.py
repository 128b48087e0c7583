"""The fleet file: outboxes listed and discovered over shared defaults, one endpoint, errors that name
the entry, the key and the fix (producer/fleet/spec.py's invariants)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from harvest_outbox.producer.config import load_yaml
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.fleet.spec import FleetFile, fleet_from_document, load_fleet, merged

DSN1 = "postgres://relay:s3cret@db1:5432/app"
DSN2 = "postgres://relay:s3cret@db2:5432/tenants"


def _doc(**sections: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "harvest": {"dataSource": DSN1, "baseKafkaConfig": {"bootstrap.servers": "k:9092"}, "name": "r1"},
        "outboxes": [{"id": "billing", "outboxTable": "billing.outbox"}, {"outboxTable": "orders.outbox"}],
    }
    base.update(sections)
    return {k: v for k, v in base.items() if v is not None}


def _fleet(doc: dict[str, Any], env: dict[str, str] | None = None, **overrides: Any) -> FleetFile:
    return fleet_from_document(doc, overrides, None, {}, env or {})


def test_each_outbox_gets_the_defaults_its_own_keys_a_name_and_an_election_of_its_own() -> None:
    doc = _doc()
    doc["harvest"]["limits"] = {"ioErrorBackoff": "200ms", "rowTimeout": "20s"}
    doc["outboxes"][0].update({"uuidSequencing": True, "limits": {"ioErrorBackoff": "50ms"}})
    fleet = _fleet(doc)
    billing, orders = fleet.listed
    assert (billing.id, orders.id) == ("billing", "app/orders.outbox")  # default id: <database>/<table>
    assert billing.config.uuid_sequencing and not orders.config.uuid_sequencing
    # mappings merge key by key: the entry's ioErrorBackoff, the defaults' rowTimeout
    assert (billing.config.limits.io_error_backoff, billing.config.limits.row_timeout) == (0.05, 20.0)
    assert billing.config.name == "r1/billing" and orders.config.name == "r1/app/orders.outbox"
    assert billing.config.leader_group_id == "harvest.billing"
    assert orders.config.leader_group_id == "harvest.app_orders.outbox"
    assert billing.config.leader_topic == "harvest.billing.neli"
    assert fleet.prometheus_port is None and fleet.options.discovery_interval == 30.0
    # a fleet's own defaults (FLEET_DEFAULTS), merged key by key under the file's
    assert billing.config.standby == "cold" and billing.config.limits.idle_poll_interval == 5.0


@pytest.mark.parametrize(
    ("defaults", "entry", "standby", "idle_poll"),
    [
        ({}, {}, "cold", 5.0),
        ({"standby": "hot", "limits": {"idlePollInterval": "1s"}}, {}, "hot", 1.0),
        ({"limits": {"rowTimeout": "20s"}}, {"limits": {"idlePollInterval": "250ms"}}, "cold", 0.25),
    ],
)
def test_a_fleets_own_defaults_yield_to_the_files(
    defaults: dict[str, Any], entry: dict[str, Any], standby: str, idle_poll: float
) -> None:
    doc = _doc()
    doc["harvest"].update(defaults)
    doc["outboxes"][0].update(entry)
    billing = _fleet(doc).listed[0]
    assert (billing.config.standby, billing.config.limits.idle_poll_interval) == (standby, idle_poll)


def test_flags_and_variables_stand_in_for_the_defaults_never_over_an_entrys_own_key() -> None:
    doc = _doc()
    doc["outboxes"][1]["dataSource"] = DSN2
    fleet = _fleet(
        doc,
        env={"HARVEST_DATA_SOURCE": "postgres://relay@elsewhere/x", "HARVEST_NAME": "fromenv"},
        uuid_sequencing=True,
        leader_group_id="g",
    )
    billing, orders = fleet.listed
    assert billing.config.data_source.endswith("@elsewhere/x")  # the variable stands in for harvest.dataSource
    assert orders.config.data_source == DSN2  # the entry's own key wins
    assert billing.config.uuid_sequencing and orders.config.uuid_sequencing
    assert billing.config.name == "fromenv/billing" and billing.config.leader_group_id == "g.billing"


def test_the_fleet_endpoint_is_the_defaults_and_found_outboxes_are_built_like_listed_ones() -> None:
    doc = _doc(
        discover=[{"schemas": "tenant_*", "harvest": {"uuidSequencing": True}}], fleet={"discoveryInterval": "2s"}
    )
    doc["harvest"]["prometheusPort"] = 0
    fleet = _fleet(doc)
    assert fleet.prometheus_port == 0 and fleet.options.discovery_interval == 2.0
    assert all(o.config.prometheus_port is None for o in fleet.listed)
    (entry,) = fleet.discoveries
    assert (entry.data_source, entry.schemas, entry.table, entry.databases) == (DSN1, "tenant_*", "outbox", ())
    found = fleet.outbox(entry.origin, merged(entry.section, {"dataSource": DSN2, "outboxTable": "tenant_a.outbox"}))
    assert found.id == "tenants/tenant_a.outbox" and found.config.uuid_sequencing
    assert found.config.leader_group_id == "harvest.tenants_tenant_a.outbox"


def test_a_one_relay_file_is_not_a_fleet_and_stays_valid(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({"harvest": {"dataSource": DSN1, "outboxTable": "billing.outbox"}}))
    assert load_fleet(path, env={}) is None
    assert load_yaml(path, env={}).harvest.outbox_table == "billing.outbox"
    fleet_path = tmp_path / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump(_doc()))
    fleet = load_fleet(fleet_path, env={})
    assert fleet is not None and [o.id for o in fleet.listed] == ["billing", "app/orders.outbox"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"nope": 1}, "'nope': unknown top-level key of a fleet file"),
        ({"outboxes": [], "discover": None}, "lists no outbox and discovers none"),
        ({"outboxes": {"id": "x"}}, "outboxes: expected a list of entries"),
        ({"outboxes": ["billing.outbox"]}, "outboxes[0]: expected a mapping"),
        ({"outboxes": [{"id": 5, "outboxTable": "a.outbox"}]}, "outboxes[0].id: 5 must be a string"),
        ({"outboxes": [{"id": "a b", "outboxTable": "a.outbox"}]}, "outboxes[0].id: 'a b' must be 1-200 printable"),
        (
            {"outboxes": [{"id": "x", "outboxTable": "a.outbox"}, {"id": "x", "outboxTable": "b.outbox"}]},
            "outboxes[1].id: 'x' is also outboxes[0]'s id",
        ),
        (
            {"outboxes": [{"outboxTable": "a.outbox"}, {"id": "again", "outboxTable": "a.outbox"}]},
            "outboxes[1]: names the outbox 'a.outbox' of outboxes[0]",
        ),
        (
            {"outboxes": [{"id": "x", "outboxTable": "a.outbox", "prometheusPort": 9}]},
            "outboxes[0].prometheusPort: a fleet serves one endpoint",
        ),
        (
            {"outboxes": [{"id": "x", "outboxTable": "a.outbox", "limits": {"rowTimeout": "fast"}}]},
            "outboxes[0] (x), over the defaults in harvest: harvest.limits.rowTimeout",
        ),
        ({"outboxes": [{"id": "x", "outboxTabel": "a.outbox"}]}, "outboxTabel: unknown key"),
        ({"discover": [{"schemas": "t_*", "tables": "x"}]}, "discover[0].'tables': unknown key"),
        ({"discover": [{"table": "app.outbox"}]}, "discover[0].table: 'app.outbox' is a table name without its schema"),
        ({"discover": [{"databases": [1]}]}, "discover[0].databases: [1] must be a list"),
        ({"discover": [{"harvest": {"outboxTable": "x"}}]}, "discover[0].harvest.outboxTable: set by discovery"),
        ({"fleet": {"discoveryInterval": "10ms"}}, "fleet.discoveryInterval: '10ms' must be between 1s and 24h"),
        ({"fleet": {"restartBackoff": 5}}, "fleet.restartBackoff: 5 is not a duration"),
        ({"fleet": {"restartBackoff": "2s", "restartBackoffMax": "1s"}}, "restartBackoffMax: must be at least"),
        ({"fleet": {"interval": "1s"}}, "fleet.'interval': unknown key"),
    ],
)
def test_a_bad_fleet_file_names_the_entry_the_key_and_the_fix(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _fleet(_doc(**change))
    assert message in str(err.value)
    assert "s3cret" not in str(err.value)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["dead-letters", "list"],
            "--outbox: missing: the file is a fleet file; name one of its 2 outboxes: app/orders.outbox, billing",
        ),
        (["check", "--outbox", "nope"], "--outbox: 'nope' is not an outbox of it; name one of its 2"),
        (["shards", "--outbox", "nope"], "'nope' is not an outbox of it"),
    ],
)
def test_a_command_on_one_outbox_of_a_fleet_file_asks_for_its_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    from harvest_outbox.producer.ops.cli import main

    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(_doc()))
    assert main([*argv, "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert said in err and "s3cret" not in err


def test_outbox_needs_a_fleet_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harvest_outbox.producer.ops.cli import main

    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({"harvest": {"dataSource": DSN1}}))
    assert main(["check", "-f", str(path), "--outbox", "billing"]) == 2
    assert "is one relay's file, not a fleet file" in capsys.readouterr().err
