"""Unpickle numpy arrays only: a pickle naming any other class or function is refused unread."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from gpuflow.errors import DataError

ALLOWED = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }
)


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a global outside ALLOWED."""

    def __init__(self, module: str, name: str):
        super().__init__(
            f"refused to unpickle {module}.{name}: only numpy array reconstruction is allowed "
            f"({', '.join(sorted(f'{m}.{n}' for m, n in ALLOWED))})"
        )


class ArrayUnpickler(pickle.Unpickler):
    """A pickle.Unpickler whose find_class admits ALLOWED and refuses everything else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED:
            raise RefusedGlobal(module, name)
        return super().find_class(module, name)


def load_arrays(raw: bytes, source: str | Path = "<bytes>") -> Any:
    """The object pickled in `raw`, or DataError naming `source` and the problem."""
    try:
        return ArrayUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except RefusedGlobal as error:
        raise DataError(source, str(error), expected="a pickle of numpy arrays only") from error
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
        raise DataError(source, f"cannot unpickle: {error}") from error
