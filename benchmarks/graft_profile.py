"""A copy of a calibrated profile with ``kernel_model`` tables taken from another profile of the same
GPU model, for post-hoc re-predictions of stored validation rows under a cost switch that reads a
table the older run did not calibrate.

    python benchmarks/graft_profile.py PROFILE.json OUT.json --table DONOR.json:hbm_deep_read [...]
    megamoe validate --report DIR --repredict OUT.json --switch USE_TASK_DEEP_READ=on --out DIR2

Each ``--table DONOR:KEY`` copies ``kernel_model.KEY`` from DONOR, its source extended to say it was
grafted (from which file, into which profile); both profiles must name the same GPU
(``gpu.num_sms`` and the description's GPU agree) or the copy is refused. The rest of the profile is
PROFILE's, unchanged; its name gets "+<KEY>" per table. The copy passes the one loader
(``simulator.hardware.validate``) before it is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def graft(profile: dict, donor: dict, key: str, *, donor_name: str) -> dict:
    """``profile`` with kernel_model[key] from ``donor`` (a new dict; neither argument changes)."""
    if key not in donor.get("kernel_model", {}):
        raise ValueError(f"{donor_name} has no kernel_model.{key}")
    sms = [d.get("gpu", {}).get("num_sms", {}).get("value") for d in (profile, donor)]
    if sms[0] != sms[1]:
        raise ValueError(f"GPU differs: {sms[0]} SMs in the profile, {sms[1]} in {donor_name}")
    table = json.loads(json.dumps(donor["kernel_model"][key]))
    table["source"] = (f"{table.get('source', '?')}; grafted from {donor_name} by benchmarks/graft_profile.py "
                       "for post-hoc re-predictions (same GPU model, not this run's calibration)")
    out = json.loads(json.dumps(profile))
    out["kernel_model"][key] = table
    out["name"] = f"{out.get('name', 'profile')}+{key}"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile", help="the profile.json to copy")
    p.add_argument("out", help="the copy")
    p.add_argument("--table", action="append", required=True, metavar="DONOR:KEY",
                   help="kernel_model.KEY of the profile DONOR (repeatable)")
    args = p.parse_args(argv)
    from megamoe.simulator.hardware import validate

    prof = json.loads(Path(args.profile).read_text())
    for spec in args.table:
        donor, sep, key = spec.rpartition(":")
        if not sep or not donor or not key:
            p.error(f"--table {spec!r}: expected DONOR.json:KEY")
        prof = graft(prof, json.loads(Path(donor).read_text()), key, donor_name=donor)
    validate(prof)
    Path(args.out).write_text(json.dumps(prof, indent=1) + "\n")
    print(f"wrote {args.out} ({prof['name']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
