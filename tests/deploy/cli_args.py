"""A `surge ...` command line (a container's entrypoint + args) checked by the CLI's own
parsers and config builders, without starting anything."""

from __future__ import annotations

import argparse
from typing import Any


def check_surge_argv(argv: list[str]) -> Any:
    """The config the command line builds; argparse's SystemExit or a ValueError if refused."""
    command, rest = argv[0], argv[1:]
    if command == "serve":
        from surge.cli.main import add_engine_args, engine_config
        from surge.cli.serve import add_server_args, server_config

        p = argparse.ArgumentParser(prog="surge serve")
        add_engine_args(p)
        add_server_args(p)
        args = p.parse_args(rest)
        return engine_config(args), server_config(args)
    if command == "gateway":
        from surge.gateway.cli import build_parser, config_from_args

        return config_from_args(build_parser().parse_args(rest))
    if command == "autoscale":
        from surge.autoscale.cli import autoscaler_config
        from surge.autoscale.cli import build_parser as autoscale_parser

        return autoscaler_config(autoscale_parser().parse_args(rest))
    raise ValueError(f"not a surge command: {command!r}")
