"""The settings' step: config-doc."""

from __future__ import annotations

import argparse

from gpuflow.registry import lazy


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add config-doc to the `gpuflow` parser."""
    config_doc = subparsers.add_parser(
        "config-doc",
        help="write config/README.md from the schema, the config files and the README template",
    )
    config_doc.add_argument("--out", default=None, help="file to write (default: config/README.md)")
    config_doc.set_defaults(run=lazy("gpuflow.settings.config_doc:main", outputs=("out",)))
