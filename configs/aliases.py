"""Experiment names that moved, beside the configs they moved into (docs/guide/configs.md).

Issue #18 folded the per-size config files into one file per family, the size (and variant) its
argument: a removed path configs/NAME.py still names the same experiment and resolves to
configs/FAMILY.py:NAME (`nsl.config.resolve_config`, which reads `FOLDED` from the `aliases.py`
beside a config path; a file that exists on disk always wins). Each family file's `ARGS` is the
list of names it took over, so the table cannot drift from the files.
"""

from configs import dd, lift, nextlat, sps

FOLDED = {"sps": sps.ARGS, "dd": dd.ARGS, "lift": lift.ARGS, "nextlat": nextlat.ARGS}
