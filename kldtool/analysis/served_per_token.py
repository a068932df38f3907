"""``compare --generated --per-token FILE``: the audit's figures at every sampled position, one
HDF5 column each (which answer, its depth in the answer, the token, the served and the base
log-probs and their difference, whether the base row held the token at its clamp, the token's
rank in the served top K, and the top K's bounds there), written whole under a temporary name
and renamed into place."""

from __future__ import annotations

import json
import os

import numpy as np

from kldtool.errors import OutputError
from kldtool.logitsfile.atomic import output_target

KIND = "kldtool served per-token"


def write_served_per_token(path: str, columns: dict[str, np.ndarray], run: dict) -> None:
    import h5py

    target = output_target(path)
    tmp = target.parent / f".{target.name}.partial-{os.getpid()}.h5"
    try:
        with h5py.File(tmp, "w") as f:
            for name, values in columns.items():
                f.create_dataset(name, data=np.ascontiguousarray(values), compression="gzip", compression_opts=4)
            f.attrs["kind"] = KIND
            f.attrs["run"] = json.dumps(run)
            f.attrs["complete"] = True
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{target}: could not write the per-token file ({e})") from None
