"""The JSON Schemas of what `--json` prints (validate, status, list, report), and a validator for the subset of
JSON Schema they use (type, properties, required, additionalProperties, items, enum, anyOf): jsonschema is not a
dependency of the runner, and these documents are the contract scripts may rely on."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "null": (type(None),),
}


def problems(value: Any, schema: Schema, path: str = "$") -> list[str]:
    """Every way `value` breaks `schema`, each with its JSON path; [] when it conforms."""
    found: list[str] = []
    if "anyOf" in schema:
        tries = [problems(value, alternative, path) for alternative in schema["anyOf"]]
        if all(tries):
            found.append(f"{path}: none of anyOf fits; the closest: {min(tries, key=len)[0]}")
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        ok = any(
            isinstance(value, _TYPES[k]) and not (isinstance(value, bool) and k in ("number", "integer")) for k in kinds
        )
        if not ok:
            return [f"{path}: {type(value).__name__} {value!r:.60} is not {' or '.join(kinds)}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        props: dict[str, Schema] = schema.get("properties", {})
        found += [f"{path}: {key!r} is missing" for key in schema.get("required", []) if key not in value]
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                found += problems(item, props[key], f"{path}.{key}")
            elif extra is False:
                found.append(f"{path}: unexpected key {key!r}")
            elif isinstance(extra, dict):
                found += problems(item, extra, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += problems(item, schema["items"], f"{path}[{index}]")
    return found


def _object(required: dict[str, Schema], optional: dict[str, Schema] | None = None, *, closed: bool = True) -> Schema:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": not closed,
    }


STRING: Schema = {"type": "string"}
NUMBER: Schema = {"type": "number"}
MAYBE_NUMBER: Schema = {"type": ["number", "null"]}
MAYBE_STRING: Schema = {"type": ["string", "null"]}
STRINGS: Schema = {"type": "array", "items": STRING}
ANY_OBJECT: Schema = {"type": "object"}
STATES = [
    "pending",
    "provisioning",
    "starting",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
    "hung",
    "lost",
]
STATE: Schema = {"type": "string", "enum": [*STATES, "?"]}

COST: Schema = {
    "type": ["object", "null"],
    "required": ["usd", "chip_hours", "ready_seconds", "open", "preemptions", "price", "nodes"],
    "properties": {"usd": NUMBER, "open": {"type": "boolean"}, "nodes": {"type": "array", "items": ANY_OBJECT}},
}
STARTUP: Schema = {
    "type": "object",
    "properties": {"missing": STRINGS},
    "required": ["missing"],
    "additionalProperties": MAYBE_NUMBER,
}
METRICS_LINE: Schema = {"type": ["object", "null"]}
# where a run's metrics came from: its metrics.jsonl, Keras' epoch lines in its log, or nowhere yet
METRICS_FROM: Schema = {"type": ["string", "null"], "enum": ["metrics.jsonl", "logs/worker-0.log", None]}
CHECKPOINT: Schema = _object(
    {
        "file": STRING,
        "epochs_done": {"type": ["integer", "null"]},
        "step": {"type": ["integer", "null"]},
        "global_step": {"type": ["integer", "null"]},
        "size": {"type": ["integer", "null"]},
        "time": MAYBE_NUMBER,
        "format": {"type": "string", "enum": ["Keras", "Orbax", "TensorFlow", "BackupAndRestore", "files"]},
        "files": {"type": "integer"},
        "title": STRING,
    }
)
# where the current attempt went on from (runner.checkpoints.resumed); null on a first attempt
RESUMED: Schema = {
    "anyOf": [
        {"type": "null"},
        _object(
            {
                "checkpoint": MAYBE_STRING,
                "step": {"type": ["integer", "null"]},
                "redone": {"type": ["integer", "null"]},
                "format": MAYBE_STRING,
                "epoch": {"type": ["integer", "null"]},
                "text": STRING,
            }
        ),
    ]
}
# where the billed time went (runner.collect.goodput); null before any machine came up
CAUSE_KEYS = [
    "productive",
    "capacity",
    "provisioning",
    "image_pull",
    "startup",
    "data",
    "checkpoint_restore",
    "checkpoint_save",
    "redone",
    "evaluation",
    "idle",
    "job",
    "unmeasured",
]
MAYBE_INTEGER: Schema = {"type": ["integer", "null"]}
GOODPUT: Schema = {
    "anyOf": [
        {"type": "null"},
        _object(
            {
                "billed_s": NUMBER,
                "billable": {"type": "boolean"},
                "open": {"type": "boolean"},
                "productive_s": MAYBE_NUMBER,
                "percent": MAYBE_NUMBER,
                "usd": MAYBE_NUMBER,
                "billed_usd": MAYBE_NUMBER,
                "no_price": MAYBE_STRING,
                "causes": {
                    "type": "array",
                    "items": _object(
                        {
                            "cause": {"type": "string", "enum": CAUSE_KEYS},
                            "label": STRING,
                            "billed_s": MAYBE_NUMBER,  # null: not measured
                            "waited_s": MAYBE_NUMBER,
                            "usd": MAYBE_NUMBER,
                            "steps": MAYBE_INTEGER,
                            "note": STRING,
                        }
                    ),
                },
                "disruptions": {
                    "type": "array",
                    "items": _object(
                        {
                            "kind": {"type": "string", "enum": ["preemption", "failure retried", "silent boot"]},
                            "attempt": {"type": "integer"},
                            "at_s": NUMBER,
                            "reached_step": MAYBE_INTEGER,
                            "resumed_step": MAYBE_INTEGER,
                            "redone_steps": MAYBE_INTEGER,
                            "redone_s": MAYBE_NUMBER,
                            "restart_s": NUMBER,
                            "lost_s": MAYBE_NUMBER,
                            "usd": MAYBE_NUMBER,
                            "back_after_s": MAYBE_NUMBER,
                        }
                    ),
                },
            }
        ),
    ]
}
EXIT: Schema = _object(
    {
        "worker": {"type": "integer"},
        "state": STATE,
        "exit_code": {"type": "integer"},
        "finished_at": NUMBER,
        "started_at": MAYBE_NUMBER,
        "error": MAYBE_STRING,
        "tail": STRINGS,
        "peer_stop": {"type": "boolean"},
    }
)

VALIDATE: Schema = _object(
    {
        "ok": {"type": "boolean"},
        "files": {
            "type": "array",
            "items": _object(
                {
                    "file": STRING,
                    "ok": {"type": "boolean"},
                    "job": MAYBE_STRING,
                    "problems": STRINGS,
                    "warnings": STRINGS,
                }
            ),
        },
    }
)

STATUS: Schema = _object(
    {
        "run_id": STRING,
        "state": STATE,
        "run_dir": STRING,
        "backend": STRING,
        "metrics": {"type": "array", "items": ANY_OBJECT},
        "metrics_from": METRICS_FROM,
        "progress": {"type": ["object", "null"]},
        "eta_s": MAYBE_NUMBER,
        "last_metrics": METRICS_LINE,
        "summary": {"type": ["object", "null"]},
        "heartbeat": {"type": ["object", "null"]},
        "exits": {"type": "array", "items": EXIT},
        "artifacts": {"type": "object", "additionalProperties": STRING},
        "checkpoints": {"type": "array", "items": CHECKPOINT},
        "resumed": RESUMED,
        "cost": COST,
        "still_billing": MAYBE_STRING,
        "startup": STARTUP,
        "goodput": GOODPUT,
        "attempts": {
            "type": "array",
            "items": _object(
                {
                    "started_at": NUMBER,
                    "finished_at": MAYBE_NUMBER,
                    "state": STATE,
                    "reason": {"type": ["string", "null"]},
                    "backend": STRING,
                    "overrides": STRINGS,
                }
            ),
        },
        "warnings": STRINGS,
    }
)

LIST: Schema = _object(
    {
        "runs": {
            "type": "array",
            "items": _object(
                {
                    "run_id": STRING,
                    "job": STRING,
                    "backend": STRING,
                    "state": STATE,
                    "created_at": NUMBER,
                    "run_dir": STRING,
                    "test_accuracy": MAYBE_NUMBER,
                    "last_metrics": METRICS_LINE,
                    "metrics_from": METRICS_FROM,
                    "cost": COST,
                    "cost_cell": STRING,
                    "still_billing": MAYBE_STRING,
                    "goodput": GOODPUT,
                    "goodput_cell": STRING,
                }
            ),
        },
        "warnings": STRINGS,
    }
)

REPORT: Schema = _object(
    {
        "run_id": STRING,
        "job": STRING,
        "backend": STRING,
        "state": STATE,
        "reason": MAYBE_STRING,
        "run_dir": STRING,
        "created_at": NUMBER,
        "finished_at": MAYBE_NUMBER,
        "spec": ANY_OBJECT,
        "spec_yaml": STRING,
        "summary": {"type": ["object", "null"]},
        "metrics": {"type": "array", "items": ANY_OBJECT},
        "metrics_from": METRICS_FROM,
        "exits": {"type": "array", "items": EXIT},
        "preemptions": {"type": "integer"},
        "machines": {"type": "integer"},
        "trainer_lines": STRINGS,
        "cost": COST,
        "startup": STARTUP,
        "timeline": _object(
            {
                "origin": NUMBER,
                "attempts": {"type": "integer"},
                "phases": {"type": "array"},
                "markers": {"type": "array"},
            }
        ),
        "checkpoints": {"type": "array", "items": CHECKPOINT},
        "resumed": RESUMED,
        "goodput": GOODPUT,
        "warnings": STRINGS,
        "generated_at": NUMBER,
        "charts": {"type": "array"},
    }
)
