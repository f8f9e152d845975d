"""The job spec: pure data, validated by pydantic v2.

Every model forbids unknown keys so a typo in YAML is an error, never a silently ignored setting. Translation of
a spec into cloud requests lives in the backends; pre-flight checks that need the TPU catalog live in the planner.
"""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from runner.launch.imageref import IMAGE_RE
from runner.spec.cluster import PATTERN_MEANINGS as CLUSTER_MEANINGS
from runner.spec.cluster import ClusterSpec
from runner.spec.secrets import SecretSpec, map_schema, secrets_map
from runner.storage import GCS_RE

# A node id and a label value must both accept "<name>-<run suffix>"; 40 characters leaves room for the suffix.
NAME_RE = r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"
TPU_TYPE_RE = r"^[a-z][a-z0-9]*-[0-9]+$"  # GENERATION-SIZE; which generations exist is the catalog's (plan)
# A zone (us-central1-a), or an AI zone (us-central1-ai1a: cloud.google.com/compute/docs/regions-zones/ai-zones),
# where the catalog has TPU7x.
ZONE_RE = r"^[a-z]+-[a-z]+[0-9]+-(ai[0-9]+)?[a-z]$"
NODE_RE = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
PROJECT_RE = r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$"
SERVICE_ACCOUNT_RE = r"^[^@\s]+@[^@\s]+\.iam\.gserviceaccount\.com$"
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION_RE = re.compile(r"^(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?$")
RESERVED_ENV_PREFIX = "RUNNER_"
# Linux gives one environment string ("KEY=VALUE" and its NUL) at most MAX_ARG_STRLEN = 32 pages (include/uapi/
# linux/binfmts.h); a longer one makes execve fail E2BIG, "Argument list too long", on any machine and in any
# container (runner.plan.limits has the platform's other limits).
MAX_ARG_STRLEN = 131_072

# What each pattern means, in words: the loader shows these instead of the regular expressions.
PATTERN_MEANINGS = {
    NAME_RE: "must be lowercase letters, digits and '-', start with a letter and be at most 40 characters",
    IMAGE_RE: "is not a container image reference like REGION-docker.pkg.dev/PROJECT/REPO/IMAGE:TAG",
    TPU_TYPE_RE: "is not a TPU accelerator type like v2-8, v3-8, v4-8, v5litepod-8, v5p-8 or v6e-8",
    ZONE_RE: "is not a zone like us-central1-a",
    NODE_RE: "is not a TPU node name (lowercase letters, digits and '-', at most 63 characters)",
    PROJECT_RE: "is not a Google Cloud project id (6-30 lowercase letters, digits and '-')",
    SERVICE_ACCOUNT_RE: "is not a service account e-mail like NAME@PROJECT.iam.gserviceaccount.com",
    **CLUSTER_MEANINGS,
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_duration(value: Any) -> Any:
    """'90m', '2h', '1h30m', '45s', '1d' or a number of seconds -> seconds. Other input is left for pydantic."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        match = _DURATION_RE.match(text)
        if text and match and any(match.groupdict().values()):
            parts = {k: int(v or 0) for k, v in match.groupdict().items()}
            return parts["d"] * 86400 + parts["h"] * 3600 + parts["m"] * 60 + parts["s"]
        if text.isdigit():
            return int(text)
        raise ValueError(f"{value!r} is not a duration; write it like '45m', '2h', '1h30m' or a number of seconds")
    return value


def check_storage(value: str) -> str:
    """The one check of where run directories go, shared by the spec's `storage:` and `submit --storage` so that
    both accept and refuse the same values with the same words. Returns the value normalised (gs:// without a
    trailing '/'); raises ValueError with the message a user sees."""
    text = value.strip()
    if not text:
        raise ValueError("storage is empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"{text!r}: storage cannot contain control characters (newline, tab, NUL)")
    # 'gs:/b', 'gs:' or 'GS://b' are typos of a bucket URL, never a local folder that a user meant to call 'gs:'.
    if text.lower().startswith("gs:"):
        url = text.rstrip("/")
        if not text.startswith("gs://") or not GCS_RE.match(url):
            raise ValueError(f"{text!r} is not gs://BUCKET[/PREFIX] with a valid bucket name")
        return url
    if "://" in text:
        raise ValueError(f"{text!r}: storage must be gs://BUCKET/PREFIX or a local path")
    return text


class AcceleratorSpec(_Model):
    """Where the job runs on Google Cloud. Ignored by `submit --local` except for reporting."""

    type: Annotated[str, Field(pattern=TPU_TYPE_RE)] = Field(
        "v5litepod-8", description="TPU accelerator type, e.g. v2-8, v3-8, v4-8, v5litepod-8, v5p-8, v6e-8."
    )
    runtime_version: str | None = Field(
        None,
        description="TPU VM runtime (software) version, e.g. tpu-vm-tf-2.18.0-pjrt or v2-alpha-tpuv5-lite. "
        "Default: the catalog's recommended runtime for the accelerator type.",
    )
    zone: Annotated[str, Field(pattern=ZONE_RE)] | None = Field(
        None, description="Zone to create the TPU VM in, e.g. us-central1-a. Use `zones` for fallbacks."
    )
    zones: list[Annotated[str, Field(pattern=ZONE_RE)]] = Field(
        default_factory=list,
        description="Ordered zones to try; a stockout in one zone moves to the next.",
        max_length=16,
    )
    project: Annotated[str, Field(pattern=PROJECT_RE)] | None = Field(
        None,
        description="Google Cloud project id. Default: --project, $CLOUDSDK_CORE_PROJECT or gcloud's config.",
    )
    spot: bool = Field(False, description="Create a Spot TPU VM (cheaper, can be preempted at any time).")
    reserved: bool = Field(False, description="Create the TPU VM from a reservation.")
    node: Annotated[str, Field(pattern=NODE_RE)] | None = Field(
        None, description="Attach to this existing TPU VM instead of creating one; it is never deleted."
    )
    service_account: Annotated[str, Field(pattern=SERVICE_ACCOUNT_RE)] | None = Field(
        None,
        description="Service account the TPU VM runs as (pulls the image, writes the run directory).",
    )
    backend: Literal["auto", "tpu-vm", "compute-engine", "gke"] = Field(
        "auto",
        description="Which cloud creates the machine: tpu-vm (the Cloud TPU API: nodes, queued resources), "
        "compute-engine (Compute Engine instances and managed instance groups), gke (a JobSet on a GKE cluster's "
        "TPU node pools: `cluster`), or auto: the catalog's default for the type's generation. `submit --local` "
        "runs on this machine.",
    )
    cluster: ClusterSpec | None = Field(
        None, description="The Kubernetes cluster of `backend: gke`: which one, its namespace, queue and node pool."
    )
    provisioning: Literal["auto", "node", "queued"] = Field(
        "auto",
        description="How the TPU VM is asked for: node (create it, fail over to the next zone on a stockout), "
        "queued (a queued resource that waits in each zone's queue for capacity, up to max_wait), or auto: queued "
        "for multi-host slices, node otherwise.",
    )
    max_wait: int | None = Field(
        None,
        ge=10,
        le=7 * 86_400,
        description="How long a queued resource may wait for capacity in each zone ('2h'): its valid-until "
        "duration, and the runner's own bound. Then the next zone is tried. Default: until the run's max_runtime.",
    )

    slices: int = Field(
        1,
        ge=1,
        le=16,
        description="Multislice: this many slices of `type`, joined over the data-center network, asked for as one "
        "queued resource (multisliceParams). Above 1 it needs provisioning queued or auto and a JAX job or a "
        "`command` (TensorFlow has no multislice path).",
    )

    _parse_max_wait = field_validator("max_wait", mode="before")(parse_duration)

    @model_validator(mode="after")
    def _consistent(self) -> AcceleratorSpec:
        if self.zone and self.zones:
            raise ValueError("give either `zone` or `zones`, not both")
        if self.spot and self.reserved:
            raise ValueError("`spot` and `reserved` cannot both be true: a TPU VM is either Spot or reserved")
        if self.node and (self.spot or self.reserved):
            raise ValueError("`node` attaches to an existing TPU VM; `spot` and `reserved` only apply to new ones")
        if len(set(self.zones)) != len(self.zones):
            raise ValueError("`zones` lists a zone twice")
        if self.node and self.provisioning == "queued":
            raise ValueError("`node` attaches to an existing TPU VM; `provisioning: queued` only applies to new ones")
        if self.max_wait is not None and (self.node or self.provisioning == "node"):
            raise ValueError("`max_wait` bounds the wait of a queued resource: it needs provisioning queued or auto")
        if self.slices > 1 and self.node:
            raise ValueError("`node` attaches to one existing TPU VM; `slices` above 1 creates a multislice")
        if (self.backend == "gke") != (self.cluster is not None):
            raise ValueError("`backend: gke` runs on a `cluster` (and a `cluster` needs `backend: gke`): give both")
        if self.slices > 1 and self.provisioning == "node":
            raise ValueError(
                "`slices` above 1 is a multislice, which Cloud TPU creates through a queued resource only: "
                "set provisioning to queued (or leave it at auto)"
            )
        return self

    @property
    def candidate_zones(self) -> list[str]:
        return list(self.zones) if self.zones else ([self.zone] if self.zone else [])


BUILTIN_MODELS = ("mnist_cnn", "mnist_mlp")
# module:function of the job's code (a dotted module path): a model or data of yours (runner.train.models.REF_RE).
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
CODE_REF_RE = rf"^{_NAME}(\.{_NAME})*:{_NAME}$"


def checkpoint_interval(value: Any) -> Any:
    """A whole number counts epochs; a duration ('10m', '1h30m', '90s') is wall-clock time, kept as '<N>s'."""
    if isinstance(value, bool):
        raise ValueError("checkpoint_every is a number of epochs or a duration like '10m'")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int):
        if not 1 <= value <= 10_000:
            raise ValueError("checkpoint_every counts epochs: 1 to 10000 (or give a duration like '10m')")
        return value
    if isinstance(value, str):
        seconds = parse_duration(value)
        if not 10 <= seconds <= 7 * 86_400:
            raise ValueError("a checkpoint_every duration must be between 10s and 7d")
        return f"{seconds}s"
    raise ValueError("checkpoint_every is a number of epochs or a duration like '10m'")


def _model_name(value: Any) -> Any:
    if isinstance(value, str) and value not in BUILTIN_MODELS and not re.match(CODE_REF_RE, value):
        raise ValueError(
            f"{value!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor module:function of your code "
            "(e.g. my_model:build)"
        )
    return value


class TrainingSpec(_Model):
    """A built-in model trained by the runner's own trainer."""

    model: str = Field(
        "mnist_cnn",
        description="mnist_cnn: the CNN of the 'GPU vs TPU' Colab notebook; mnist_mlp: the Dense-128 classifier of "
        "the GPU/TPU getting-started guides; or module:function of your code, a function returning a Keras model "
        "(it may take input_shape and num_classes), imported from the job's working directory (/workspace in the "
        "image `runner build --context` makes).",
        json_schema_extra={"anyOf": [{"enum": list(BUILTIN_MODELS)}, {"pattern": CODE_REF_RE}]},
    )
    dataset: Literal["mnist"] = Field("mnist", description="Training data set, when `data` gives none.")
    data: str | None = Field(
        None,
        description="The data: a .npz with x_train/y_train/x_test/y_test of any shapes, sparse or one-hot labels "
        "(local path or gs://), or module:function of your code returning those four arrays (or a pair of "
        "tf.data.Datasets of batches). Default: MNIST from the runner's data cache, then the Keras cache, then the "
        "Keras download.",
    )
    epochs: int = Field(3, ge=1, le=10_000, description="Number of passes over the training set.")
    batch_size: int = Field(
        1024, ge=1, le=1 << 20, description="Global batch size; each replica gets batch_size / replicas."
    )
    learning_rate: float = Field(3e-3, gt=0, le=10, description="Optimizer learning rate.")
    optimizer: Literal["adam", "sgd", "rmsprop"] = Field("adam", description="Optimizer.")
    checkpoint_every: int | str = Field(
        1,
        description="Save a checkpoint every N epochs (a number), or every so much wall-clock time, mid-epoch if "
        "need be ('10m', '1h': Google suggests about hourly on long runs). A stop (SIGTERM: preemption, "
        "`runner down`, Ctrl-C) always saves an exact mid-epoch checkpoint first.",
    )
    checkpoint_keep: int = Field(
        2, ge=1, le=100, description="Keep the newest N checkpoints (locally and in the run directory)."
    )
    framework: Literal["tensorflow", "jax"] = Field(
        "tensorflow",
        description="The engine under the built-in trainer: tensorflow (TPUStrategy, what Colab notebooks use) or "
        "jax (Keras 3 on JAX with keras.distribution: every TPU generation, pod slices and multislice).",
    )
    keras: Literal["auto", "keras3", "tf_keras"] = Field(
        "auto",
        description="Keras implementation under TensorFlow: keras3, or tf_keras (legacy Keras 2, what Google's TPU "
        "CI uses). auto picks tf_keras on TPU and keras3 elsewhere. The jax framework always uses Keras 3.",
    )
    max_train_examples: int | None = Field(None, ge=1, description="Train on the first N examples only.")
    max_test_examples: int | None = Field(None, ge=1, description="Evaluate on the first N test examples only.")
    seed: int = Field(0, ge=0, description="Seed for shuffling and weight initialisation.")
    steps_per_execution: int | None = Field(
        None, ge=1, le=10_000, description="Training steps per compiled call (cuts per-step overhead on TPU)."
    )
    precision: Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"] = Field(
        "auto",
        description="Keras dtype policy. auto: mixed_bfloat16 on TPU; on a CPU with native bfloat16 "
        "(AVX512-BF16, AMX) whichever of float32 and mixed_bfloat16 a short calibration at start-up measures "
        "faster for this model and batch (cached; on every CPU it also times the model's dropout in one XLA "
        "kernel against Keras' own); mixed_float16 on GPUs of compute capability 7.0+; float32 elsewhere.",
    )

    _checkpoint_every = field_validator("checkpoint_every", mode="before")(checkpoint_interval)
    _model = field_validator("model", mode="before")(_model_name)

    @field_validator("data")
    @classmethod
    def _data(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(ord(c) < 32 for c in value)):
            raise ValueError("data is empty or holds control characters")
        return value

    @model_validator(mode="after")
    def _engine(self) -> TrainingSpec:
        if self.framework == "jax" and self.keras == "tf_keras":
            raise ValueError("tf_keras runs on TensorFlow only: with framework jax, leave keras at auto (Keras 3)")
        return self

    @property
    def checkpoint_epochs(self) -> int | None:
        """Epochs between checkpoints, or None when checkpoints go by wall-clock time."""
        return self.checkpoint_every if isinstance(self.checkpoint_every, int) else None

    @property
    def checkpoint_seconds(self) -> float | None:
        """Seconds between checkpoints, or None when checkpoints go by epochs."""
        return float(parse_duration(self.checkpoint_every)) if isinstance(self.checkpoint_every, str) else None


class CheckpointSpec(_Model):
    """Checkpoints of a `command` job that uses the runner's library (keras_callbacks()): when it saves and how many
    it keeps, locally and in the run directory. (The built-in trainer's are training.checkpoint_every and
    training.checkpoint_keep.)"""

    every: int | str = Field(
        1,
        description="Save every N epochs (a number), or every so much wall-clock time, mid-epoch if need be "
        "('10m', '1h'). A stop (SIGTERM: preemption, `runner down`, Ctrl-C) always saves an exact checkpoint first.",
    )
    keep: int = Field(
        2, ge=1, le=100, description="Keep the newest N checkpoints; a new machine restores the newest N too."
    )

    _every = field_validator("every", mode="before")(checkpoint_interval)


class TeardownSpec(_Model):
    """When the machine is deleted; the run directory is always kept."""

    policy: Literal["always", "on_success", "never"] = Field(
        "always",
        description="always: delete the TPU VM when the run ends; on_success: keep it after a failure for "
        "debugging; never: keep it (you pay until you delete it).",
    )
    max_runtime: int = Field(
        86_400,
        ge=60,
        le=30 * 86_400,
        description="Stop the job and delete the machine after this long ('45m', '12h', '2d' or seconds).",
    )

    boot_timeout: int = Field(
        600,
        ge=10,
        le=86_400,
        description="Once the TPU VM is READY, how long its startup script may take to report in ('10m'). A VM "
        "silent for longer is deleted and created once more, then the run fails with the reason.",
    )
    hang_timeout: int | None = Field(
        None,
        ge=10,
        le=7 * 86_400,
        description="Stop the job, record it as hung and delete the machine when its training step has not "
        "advanced for this long ('30m'); custom commands count new log output as progress. Off by default.",
    )
    runner_heartbeat_timeout: int | None = Field(
        None,
        ge=60,
        le=7 * 86_400,
        description="Stop the job and delete the TPU VM when the submitting runner has not been heard from for "
        "this long ('10m'). Off by default, so that a detached run or a closed laptop does not stop training.",
    )

    _parse_durations = field_validator(
        "max_runtime", "boot_timeout", "hang_timeout", "runner_heartbeat_timeout", mode="before"
    )(parse_duration)


class RetrySpec(_Model):
    """What is retried, and how often. A preemption is not the job's fault; a failure usually is."""

    preemptions: int = Field(
        3,
        ge=0,
        le=100,
        description="Recreate a preempted TPU VM this many times; the job resumes from its newest checkpoint.",
    )
    failures: int = Field(0, ge=0, le=10, description="Run the job again after it exits non-zero this many times.")
    capacity_wait: int = Field(
        0,
        ge=0,
        le=7 * 86_400,
        description="When every zone is out of capacity, keep trying them for this long ('30m'); 0 gives up at once.",
    )

    _parse_wait = field_validator("capacity_wait", mode="before")(parse_duration)


def _env_value(text: str) -> str:
    # On a TPU VM the job's environment travels as a Docker env file, one KEY=VALUE a line; a process's environment
    # cannot hold a NUL at all. Refused here, with its line, rather than by whatever renders it later.
    if any(char in text for char in "\n\r\0"):
        raise ValueError(
            "an environment value cannot hold a line break or a NUL (a container's environment file has one "
            "variable per line); put the text in a file the job reads, or base64-encode it"
        )
    return text


EnvValue = Annotated[str, AfterValidator(_env_value)]
T = TypeVar("T")


def _variable_names(value: dict[str, T]) -> dict[str, T]:
    """The keys of `env` and `secrets`: environment variable names, none of the runner's own."""
    for key in value:
        if not ENV_KEY_RE.match(key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
        if key.startswith(RESERVED_ENV_PREFIX):
            raise ValueError(f"{key!r}: names starting with {RESERVED_ENV_PREFIX} are set by the runner")
    return value


class JobSpec(_Model):
    """One training job: what to run, on what, where its artifacts go and when to tear down."""

    name: str = Field(pattern=NAME_RE, description="Job name: lowercase letters, digits and '-', at most 40.")
    image: str = Field(
        pattern=IMAGE_RE,
        description="Container image with the trainer, e.g. us-central1-docker.pkg.dev/PROJECT/REPO/trainer:TAG.",
    )
    accelerator: AcceleratorSpec = Field(default_factory=AcceleratorSpec)
    training: TrainingSpec | None = Field(None, description="Train a built-in model (or give `command`).")
    command: list[str] | None = Field(
        None,
        min_length=1,
        description="Custom command run inside the container instead of the built-in trainer: a list (exec "
        "form) or a string (run by /bin/sh -c).",
    )
    checkpoints: CheckpointSpec | None = Field(
        None,
        description="For a `command`: when keras_callbacks() saves and how many checkpoints are kept and restored "
        "(default every epoch, 2 kept). The built-in trainer's are in `training`.",
    )
    env: dict[str, EnvValue] = Field(
        default_factory=dict, description="Extra environment variables for the job (plain text: no secrets)."
    )
    secrets: dict[str, SecretSpec] = Field(
        default_factory=dict,
        description="The job's secrets by environment variable name, each a reference to where it is kept (a Secret "
        "Manager version, read on the TPU VM with the VM's service account; for --local runs also env:VARIABLE or "
        "file:PATH of this machine), never the value: `WANDB_API_KEY: wandb/versions/latest`, or "
        "`{ref: ..., as: file}` for a file. Values are replaced in the job's logs.",
        json_schema_extra=map_schema,
    )
    storage: str = Field(
        ".",
        description="Where run directories (<storage>/runs/<run-id>) go: gs://BUCKET/PREFIX, or a local path "
        "(local runs only; relative to the current directory).",
    )
    teardown: TeardownSpec = Field(default_factory=TeardownSpec)
    retries: RetrySpec = Field(default_factory=RetrySpec)
    budget: float | None = Field(
        None,
        gt=0,
        le=1_000_000,
        description="The most the run may cost on Cloud TPU, in US dollars at the catalog's list prices (50 or "
        "'$50'). A teardown.max_runtime that could cost more is refused at plan time; left at its default, "
        "max_runtime is cut to what the budget buys. Not applied to local runs.",
    )

    @field_validator("budget", mode="before")
    @classmethod
    def _dollars(cls, value: Any) -> Any:
        """'$50', '50 USD' and '1,000' read as numbers; anything else is left for pydantic to refuse."""
        if isinstance(value, bool):  # YAML's `yes`: never an amount
            raise ValueError("budget is an amount of US dollars, like 50 or '$50'")
        if isinstance(value, str):
            text = value.strip().removeprefix("$").removesuffix("USD").replace(",", "").strip()
            try:
                return float(text)
            except ValueError:
                raise ValueError(f"{value!r} is not an amount of US dollars; write it like 50 or '$50'") from None
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _shell_form(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("command is empty")
            return ["/bin/sh", "-c", value]
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env_values(cls, value: Any) -> Any:
        # YAML reads `EPOCHS: 3` as an int; an environment only holds strings, so numbers are converted.
        # Booleans are not: YAML 1.1 turns `yes`/`on` into True, and "True" is rarely what was meant.
        if isinstance(value, dict):
            return {
                k: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for k, v in value.items()
            }
        return value

    @field_validator("env")
    @classmethod
    def _env_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in _variable_names(value):
            if (size := len(f"{key}={value[key]}".encode()) + 1) > MAX_ARG_STRLEN:
                raise ValueError(
                    f"{key}: {size:,} bytes as one KEY=VALUE string, over the {MAX_ARG_STRLEN:,} bytes (128 KiB) Linux "
                    "gives one environment string (MAX_ARG_STRLEN): the job could not be started; put the text in "
                    "a file the job reads"
                )
        return value

    _secrets_map = field_validator("secrets", mode="before")(secrets_map)

    @field_validator("secrets")
    @classmethod
    def _secret_keys(cls, value: dict[str, SecretSpec]) -> dict[str, SecretSpec]:
        return _variable_names(value)

    @field_validator("storage")
    @classmethod
    def _storage(cls, value: str) -> str:
        return check_storage(value)

    @model_validator(mode="after")
    def _one_workload(self) -> JobSpec:
        if both := sorted(set(self.env) & set(self.secrets)):
            raise ValueError(f"{', '.join(both)}: in both `env` and `secrets`; a variable is one or the other")
        if self.training is not None and self.command is not None:
            raise ValueError("give either `training` (built-in trainer) or `command` (your own), not both")
        if self.training is None and self.command is None:
            raise ValueError("nothing to run: add a `training` section or a `command`")
        if self.training is not None and self.checkpoints is not None:
            raise ValueError(
                "`checkpoints` is for a `command`; the built-in trainer's are training.checkpoint_every and "
                "training.checkpoint_keep"
            )
        if self.accelerator.slices > 1 and self.training is not None and self.training.framework == "tensorflow":
            raise ValueError(
                "accelerator.slices above 1 (multislice) needs training.framework jax or a `command`: TensorFlow has "
                "no multislice path (Cloud TPU Multislice runs JAX and PyTorch)"
            )
        return self

    @property
    def checkpoint_policy(self) -> tuple[int | str, int]:
        """(every, keep) of the run's checkpoints, whoever writes them."""
        if self.training is not None:
            return self.training.checkpoint_every, self.training.checkpoint_keep
        given = self.checkpoints or CheckpointSpec()
        return given.every, given.keep

    @property
    def command_line(self) -> str | None:
        """The custom command as one shell-quoted line, for display."""
        return shlex.join(self.command) if self.command else None
