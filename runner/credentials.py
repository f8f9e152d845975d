"""Google credentials, as every client of the runner gets them: Application Default Credentials with the
cloud-platform scope, or, when an emulator's endpoint is set, none at all.

Each backend's API seam (the Cloud TPU API, Compute Engine) and the registry check ask here, so that a missing login
is said once, the same way, with what to run. google-auth is imported only when credentials are asked for.
"""

from __future__ import annotations

from typing import Any

from runner.errors import BackendError

# The OAuth scope a TPU VM's service account and the runner's own clients ask for: the VM's TPUClusterResolver, the
# bucket and the registry need it (cloud.google.com/compute/docs/access/service-accounts#scopes_best_practice).
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


def default_credentials() -> Any:
    """Application Default Credentials with the cloud-platform scope; BackendError, with the command that fixes it,
    when there are none."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM])
    except DefaultCredentialsError as exc:
        raise BackendError(
            "no Google Cloud credentials found",
            hint="run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS "
            "to a service-account key)",
        ) from exc
    return credentials


def anonymous() -> Any:
    """No credentials: what an emulator's endpoint is called with (it checks none)."""
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()
