"""`surge serve`'s HTTP-side flags -> ServerConfig (the engine's flags are in cli.py).

The flags come from ServerConfig's fields (surge/server/config.py): a new option is one field.
"""

from __future__ import annotations

import argparse

from surge.config.flags import add_config_args, config_from_args
from surge.server.config import ServerConfig

SERVER_GROUP = "server"


def add_server_args(p: argparse.ArgumentParser) -> None:
    add_config_args(p, ServerConfig, SERVER_GROUP)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig from the flags; what one flag takes from another is filled in here."""
    return config_from_args(
        ServerConfig,
        args,
        SERVER_GROUP,
        {
            "served_model_name": args.served_model_name or args.model,
            "observability.tracing.service_name": "surge-server",
            "observability.tracing.instance_id": f"{args.host}:{args.port}",
        },
    )
