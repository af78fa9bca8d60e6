"""The Hugging Face Hub as DARE meets it. Before a hub name (a model or a dataset) loads, one quick probe tells
whether the hub can be reached; when it cannot, the process switches to the libraries' offline mode, so a cached copy
loads at once (no five retries per file, ~30 s) and a missing one fails with a line naming it."""

import functools
import os
import socket
import sys
from urllib.parse import urlparse

PROBE_SECONDS = 3.0


def endpoint_host() -> str:
    return urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"


def offline() -> bool:
    import huggingface_hub.constants
    return huggingface_hub.constants.is_offline_mode()


@functools.cache
def reachable() -> bool:
    """The hub answers a TCP connection within ``PROBE_SECONDS`` (False in offline mode: nothing is tried)."""
    if offline():
        return False
    try:
        socket.create_connection((endpoint_host(), 443), timeout=PROBE_SECONDS).close()
        return True
    except OSError:
        return False


def before_loading() -> None:
    """Call before loading a hub name: on an unreachable hub, offline mode for this process and its children."""
    if reachable() or offline():
        return
    print(f"note: {endpoint_host()} cannot be reached; loading from the local cache only (offline mode)",
          file=sys.stderr)
    os.environ["HF_HUB_OFFLINE"] = "1"
    import huggingface_hub.constants
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    datasets = sys.modules.get("datasets")
    if datasets is not None:  # it copies the flag when imported
        datasets.config.HF_HUB_OFFLINE = True


def missing(kind: str, name: str, error: Exception) -> Exception:
    """The error to raise for hub name ``name`` that failed to load: offline and not cached, said in one line."""
    if not offline():
        return error
    import huggingface_hub.constants
    return OSError(f"{kind} {name}: not in the local hub cache ({huggingface_hub.constants.HF_HUB_CACHE}) and "
                   f"{endpoint_host()} cannot be reached (offline mode); download it where there is a network "
                   "(`hf download`) or give a local folder")
