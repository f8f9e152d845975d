# The GKE rehearsal's Kubernetes control plane on this machine, for the tests that run a real API server
# (tests/kube/, and the gke backend's). Included by the Makefile.
#
#   make kube     etcd, kube-apiserver, kube-scheduler and kube-controller-manager (Kubernetes 1.20.2) built once from
#                 Debian's packages (infra/kube-build.sh: apt-get as root or through sudo), cached in
#                 ~/.cache/tpu-runner/kube/bin with a STAMP of what built them; a second run takes a second.
#                 `make test` runs it; a failure is a warning (the tests that need it then skip, naming why), except
#                 with CI=true, where it fails the run.
#   make kube-rebuild   the same, built again (KUBE_CACHE=DIR puts the cache elsewhere)

.PHONY: kube kube-rebuild

kube:  ## the GKE rehearsal's Kubernetes control plane, built once from Debian's packages (cached)
	@infra/kube-build.sh || { \
	  if [ "$${CI:-}" = true ]; then echo "[kube] CI=true: the Kubernetes rehearsal cannot run" >&2; exit 1; fi; \
	  echo "[kube] warning: no Kubernetes control plane; the tests that need one will skip" >&2; }

kube-rebuild:  ## build the Kubernetes control plane again
	infra/kube-build.sh --force
