"""A relay process for fault-injection runs: the real relay (:class:`producer.Harvest`, or the sharded one
with ``shards: S`` > 1, as ``harvest -f`` picks), configured from the same YAML as ``harvest -f``, with
produce/delivery failures injected by :class:`producer.kafka.FaultInjector` around the real confluent producer.

    HARVEST_FAULTS="produce=0.02,delivery=0.02,seed=7" python -m harvest_outbox.harvest_local.relay_runner -f harvest.yaml --name r1
    HARVEST_FAULTS="failkey=poison,killat=2" ...   # every delivery of key 'poison' fails; SIGKILL at its 2nd produce

    HARVEST_TEST_CRASH_AT=after_commit_before_ack:3 python -m ...   # SIGKILL at that point of the 3rd transaction
    HARVEST_TEST_PAUSE_AT=after_delivery_before_commit:3 python -m ...   # SIGSTOP there (a zombie)

The crash/pause hooks (``--uuid-sequencing``, :func:`producer.relay.crash_points.install_crash_points`) exist
only here: the ``harvest`` command ignores those variables. Without any of them this runner is
equivalent to ``harvest -f harvest.yaml --name r1``. Test use only.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from harvest_outbox.harvest_local.relays import TEST_HOOKS
from harvest_outbox.producer.config import load_yaml
from harvest_outbox.producer.errors import ConfigError
from harvest_outbox.producer.kafka import FaultInjector
from harvest_outbox.producer.ops.cli import EXIT_FORCED
from harvest_outbox.producer.relay.crash_points import install_crash_points
from harvest_outbox.producer.relay.sharded import relay_for
from harvest_outbox.producer.relay.signals import StopSignals

log = logging.getLogger("harvest.relay_runner")


def parse_faults(spec: str) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, value = part.partition("=")
        if name not in ("produce", "delivery", "seed", "failkey", "killat"):
            raise SystemExit(
                f"HARVEST_FAULTS: unknown fault {name!r}; use produce=, delivery=, seed=, failkey=, killat="
            )
        out[name] = value if name == "failkey" else float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harvest_outbox.harvest_local.relay_runner")
    parser.add_argument("-f", "--file", required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args(argv)
    signals = StopSignals(forced_exit=EXIT_FORCED).install()  # as the harvest command answers them
    try:
        crash_at, pause_at = (os.environ.get(var) for var in TEST_HOOKS)
        install_crash_points(crash_at, pause_at, names=TEST_HOOKS)
    except ConfigError as exc:
        print(f"relay_runner: {exc}", file=sys.stderr)
        return 2
    cfg = load_yaml(args.file, {"name": args.name}, None)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    faults = parse_faults(os.environ.get("HARVEST_FAULTS", ""))
    factory = None
    if faults.get("produce") or faults.get("delivery") or faults.get("failkey"):
        fail_key = faults.get("failkey")
        factory = FaultInjector(
            float(faults.get("produce", 0.0)),
            float(faults.get("delivery", 0.0)),
            int(faults.get("seed", 0)),
            fail_keys=frozenset({str(fail_key).encode()}) if fail_key else frozenset(),
            kill_at_produce=int(faults.get("killat", 0)),
        )
        log.info("injecting faults: %s", faults)
    # as the harvest command does: a sharded relay for shards: S > 1 (a plain Harvest would refuse the outbox)
    relay = relay_for(cfg.harvest, producer_factory=factory) if factory else relay_for(cfg.harvest)
    signals.attach(relay)
    relay.start()
    while not relay.wait(0.5):
        pass
    if factory is not None:
        log.info("faults injected: %s", factory.counters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
