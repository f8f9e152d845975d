"""accelerator.cluster: the Kubernetes cluster a job runs on when its backend is a cluster's (a GKE cluster with TPU
node pools). Pure data, like the rest of the spec: which cluster, which namespace and queue, and whether the job
takes an existing node pool or the runner makes one for the run (and deletes it when the run ends).

    accelerator:
      type: v5p-16
      backend: gke
      cluster:
        location: us-central1          # the cluster's region or zone ...
        name: tpu-cluster              # ... and name (the project: accelerator.project, --project or gcloud's)
        # context: my-context          # or a kubeconfig context (then node_pool names an existing pool)
        namespace: team-a
        queue: team-a-queue            # a Kueue LocalQueue (optional)
        node_pool: tpu-v5p-pool        # an existing pool: used as it is, never created or deleted
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

# A GKE cluster's location: a region (us-central1) or a zone (us-central1-a).
LOCATION_RE = r"^[a-z]+-[a-z]+[0-9]+(-(ai[0-9]+)?[a-z])?$"
# Cluster and node pool names: GKE's rule (lowercase letters, digits and '-', at most 40, a letter first).
CLUSTER_NAME_RE = r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$"
# A namespace or a LocalQueue: a DNS label (RFC 1123), at most 63 characters.
DNS_LABEL_RE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# A resource policy or a reservation: a Compute Engine resource name.
RESOURCE_NAME_RE = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
CONTEXT_RE = r"^[^\s]{1,253}$"

PATTERN_MEANINGS = {
    LOCATION_RE: "is not a region like us-central1 or a zone like us-central1-a",
    CLUSTER_NAME_RE: "must be lowercase letters, digits and '-', start with a letter and be at most 40 characters",
    DNS_LABEL_RE: "is not a Kubernetes name (lowercase letters, digits and '-', at most 63 characters)",
    CONTEXT_RE: "is not a kubeconfig context name (no spaces)",
}


class ClusterSpec(BaseModel):
    """Where a cluster backend runs the job: the cluster (GKE's project/location/name, or a kubeconfig context), the
    namespace, the Kueue queue, and the node pool (an existing one, or one the runner creates for the run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    location: Annotated[str, Field(pattern=LOCATION_RE)] | None = Field(
        None, description="The GKE cluster's region or zone, e.g. us-central1 (with `name`)."
    )
    name: Annotated[str, Field(pattern=CLUSTER_NAME_RE)] | None = Field(
        None, description="The GKE cluster's name (with `location`; its project is accelerator.project's)."
    )
    context: Annotated[str, Field(pattern=CONTEXT_RE)] | None = Field(
        None,
        description="A kubeconfig context to reach the cluster by instead of GKE's API ($KUBECONFIG or "
        "~/.kube/config). Without `location` and `name` the runner cannot create node pools: give `node_pool`.",
    )
    namespace: Annotated[str, Field(pattern=DNS_LABEL_RE)] = Field(
        "default", description="The namespace the job's JobSet goes into."
    )
    queue: Annotated[str, Field(pattern=DNS_LABEL_RE)] | None = Field(
        None, description="A Kueue LocalQueue in the namespace: the JobSet waits there for its quota."
    )
    node_pool: Annotated[str, Field(pattern=CLUSTER_NAME_RE)] | None = Field(
        None,
        description="An existing TPU node pool to run on: used as it is, never created or deleted (the plan says "
        "what it costs while idle). Without it, the runner creates a node pool for the run (on-demand, Spot with "
        "accelerator.spot, flex-start with provisioning: queued, or a reservation with accelerator.reserved) in the "
        "first of accelerator.zone(s) with capacity, and deletes it when the run ends.",
    )
    reservation: Annotated[str, Field(pattern=RESOURCE_NAME_RE)] | None = Field(
        None, description="The reservation a created node pool consumes (with accelerator.reserved; else any)."
    )
    workload_policy: Annotated[str, Field(pattern=RESOURCE_NAME_RE)] | None = Field(
        None,
        description="A Compute Engine workload policy (HIGH_THROUGHPUT, the slice's topology) a created multi-host "
        "TPU7x node pool is placed by, as GKE requires for TPU7x: `gcloud compute resource-policies create "
        "workload-policy NAME --type=HIGH_THROUGHPUT --accelerator-topology=TOPOLOGY --region=REGION`.",
    )

    @model_validator(mode="after")
    def _reachable(self) -> ClusterSpec:
        if (self.location is None) != (self.name is None):
            raise ValueError("give the cluster's `location` and `name` together")
        if self.location is None and self.context is None:
            raise ValueError("name the cluster: `location` and `name` (GKE), or a kubeconfig `context`")
        if self.node_pool is None and self.location is None:
            raise ValueError(
                "the runner creates a node pool through GKE's API, which needs the cluster's `location` and `name`; "
                "with a kubeconfig `context` alone, give an existing `node_pool`"
            )
        if self.node_pool is not None and (self.reservation or self.workload_policy):
            raise ValueError(
                "`reservation` and `workload_policy` are for a node pool the runner creates, not `node_pool`"
            )
        return self

    @property
    def creates_pool(self) -> bool:
        return self.node_pool is None
