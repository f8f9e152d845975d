"""The storage emulator's object downloads carry the object's generation, as Cloud Storage's do.

Cloud Storage answers a media download with `x-goog-generation` and `x-goog-metageneration` (cloud.google.com/
storage/docs/xml-api/reference-headers); gcp-storage-emulator sends neither. TensorStore (Orbax's writer on gs://)
takes a read's generation from that header and makes the next write of the same object conditional on it: without
the header it reads generation 0, and its write of an OCDBT manifest it has read back (a cache revalidated after a
while, or a new process opening the database) fails with "Malformed StorageGeneration". install() adds the headers
to the emulator's download handler; every place that starts the emulator calls it first.
"""

from __future__ import annotations

from typing import Any

_INSTALLED = False


def install() -> None:
    """Wrap gcp_storage_emulator's download handler (its route table and its own alt=media path); idempotent."""
    global _INSTALLED
    if _INSTALLED:
        return
    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    original = objects.download

    def download(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(request, response, storage, *args, **kwargs)
        if int(response.status) < 300:
            try:
                obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            except NotFound:  # deleted in between: the body already sent says what it was
                return result
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj.get("metageneration") or 1)
        return result

    objects.download = download  # objects.get's alt=media path calls it by this name
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is original:
                handlers[method] = download
    _INSTALLED = True
