"""Project and zone defaults the way gcloud keeps them, read without running gcloud (fast, works offline).

Order, as gcloud itself applies it: $CLOUDSDK_CORE_PROJECT / $CLOUDSDK_COMPUTE_ZONE, then the active
configuration file ($CLOUDSDK_CONFIG or ~/.config/gcloud, configurations/config_<active>). $GOOGLE_CLOUD_PROJECT
is honoured too, as the client libraries do.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path


def _config_dir(environ: dict[str, str]) -> Path:
    return Path(environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")


def _active_config(environ: dict[str, str]) -> configparser.ConfigParser | None:
    base = _config_dir(environ)
    name = environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
    if not name:
        try:
            name = (base / "active_config").read_text().strip() or "default"
        except OSError:
            name = "default"
    parser = configparser.ConfigParser()
    try:
        parser.read(base / "configurations" / f"config_{name}")
    except configparser.Error:
        return None
    return parser


def default_project(environ: dict[str, str] | None = None) -> str | None:
    env = dict(os.environ if environ is None else environ)
    for key in ("CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT"):
        if env.get(key):
            return env[key]
    config = _active_config(env)
    return config.get("core", "project", fallback=None) if config else None


def default_zone(environ: dict[str, str] | None = None) -> str | None:
    env = dict(os.environ if environ is None else environ)
    if env.get("CLOUDSDK_COMPUTE_ZONE"):
        return env["CLOUDSDK_COMPUTE_ZONE"]
    config = _active_config(env)
    return config.get("compute", "zone", fallback=None) if config else None
