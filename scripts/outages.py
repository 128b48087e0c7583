"""The outage matrix: every fault of harvest_local/outages.py in both modes, as docs/reliability.md's table.

    .venv/bin/python scripts/outages.py [--duration 60] [--faults pg_down,broker_pause] [--modes seq,alo]

Starts its own Postgres and Kafka (the runs pause, kill and restart them), runs each fault against
a 2-relay group while writers commit, prints one table row per run as it finishes and the whole
Markdown table at the end; exits 1 if any run lost, reordered or (``--uuid-sequencing``) duplicated
a row, left a relay dead, or never delivered the backlog. Logs of each run: .work/outages/<fault>-<mode>/.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harvest_outbox.harvest_local import LocalServices
from harvest_outbox.harvest_local.outages import FAULTS, Outage, run_outage, table
from harvest_outbox.harvest_local.workdir import work_dir


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds each timed fault lasts")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--modes", default="seq,alo", help="seq (--uuid-sequencing) and/or alo (at-least-once)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"--faults: unknown {', '.join(sorted(unknown))}; use {', '.join(FAULTS)}")
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - {"seq", "alo"}:
        parser.error("--modes: use seq and/or alo")
    results = []
    with LocalServices() as services:
        for fault in faults:
            for mode in modes:
                outage = Outage(fault, mode == "seq", duration=args.duration)
                result = run_outage(services, outage, work_dir() / "outages" / f"{fault}-{mode}")
                results.append(result)
                print(
                    table([result]).splitlines()[-1],
                    f"{'OK' if result.ok else 'FAIL'} {result.notes or ''}",
                    flush=True,
                )
    print()
    print(table(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
