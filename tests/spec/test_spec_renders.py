"""Every value the spec accepts can be rendered: a spec that loads (from YAML, as a user writes it) gives a TPU VM
request and startup script that validate and render, and a local process environment the operating system takes.
Whatever the strings, the answer is a SpecError (exit 2, with the line) or a run that can start: never a ValueError
from deep inside the bootstrap's renderer."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.backends import container, plan_cloud, plan_local
from runner.backends.tpu_vm.requests import node_request
from runner.errors import SpecError
from runner.launch.bootstrap import render
from runner.spec.loader import load_spec_text

IMAGE = "us-central1-docker.pkg.dev/my-project/tpu-runner/trainer:1"
# Any character a YAML string can carry (escapes included), the troublesome ones often.
text = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"), st.sampled_from(["\n", "\r", "\0", "\t", "'", '"', "$", "`", "\\", " "])
    ),
    max_size=30,
)
env_key = st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True)


def yaml_spec(command: list[str], env: dict[str, str], storage_suffix: str, name: str) -> str:
    doc = {
        "name": name,
        "image": IMAGE,
        "command": command,
        "env": env,
        "storage": f"gs://my-bucket/p{storage_suffix}",
        "accelerator": {"type": "v2-8", "zone": "us-central1-b", "project": "my-project"},
    }
    return yaml.safe_dump(doc, allow_unicode=True)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    command=st.lists(text, min_size=1, max_size=3),
    env=st.dictionaries(env_key, text, max_size=3),
    storage_suffix=text,
    name=st.one_of(st.just("job"), text),
)
def test_whatever_the_spec_accepts_renders(
    command: list[str], env: dict[str, str], storage_suffix: str, name: str
) -> None:
    try:
        spec = load_spec_text(yaml_spec(command, env, storage_suffix, name), "job.yaml")
    except SpecError:
        return  # refused where it is read: exit 2 with its line
    cloud = plan_cloud(spec, None, environ={})
    body = node_request(cloud, "us-central1-b")
    script = render(cloud, "us-central1-b")
    from google.cloud import tpu_v2

    tpu_v2.Node.from_json(json.dumps(body))  # what create_node sends, through the client's own message
    assert script.startswith("#!/bin/bash")
    local = plan_local(spec, None, storage="/tmp/renders")
    launch = container.plan_launch(spec.image, local.env, name="r", data_dir=None, storage_root=None, prefer="process")
    # The operating system takes the environment (no NUL, encodable): the process starts.
    done = subprocess.run([sys.executable, "-c", "pass"], env=launch.env, check=False)
    assert done.returncode == 0
