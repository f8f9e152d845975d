"""A GKE API (container.v1) emulator for the real google-cloud-container client: clusters, TPU node pools and their
operations, checked against Google's discovery document, with node pools whose nodes are made in a real Kubernetes
API server (tpu_emulator.kube). See tpu_emulator.gke.emulator and docs/emulator.md."""
