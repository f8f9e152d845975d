"""A certificate authority and a serving certificate for 127.0.0.1, made with openssl (Debian's, on every machine
that runs the rehearsal): what the API server needs to call an admission webhook. Go 1.15 ignores the common name,
so the address is in subjectAltName."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServingCert:
    ca: Path  # the CA certificate (PEM): the webhook configuration's caBundle
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=120)


def serving_cert(folder: Path, name: str) -> ServingCert:
    """The CA and a certificate for https://127.0.0.1 in `folder` (made once; kept for later starts)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = ServingCert(folder / f"{name}-ca.crt", folder / f"{name}.crt", folder / f"{name}.key")
    if out.ca.exists() and out.cert.exists() and out.key.exists():
        return out
    ca_key = folder / f"{name}-ca.key"
    csr = folder / f"{name}.csr"
    ext = folder / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "7",
        "-subj",
        f"/CN={name}-ca",
        "-keyout",
        str(ca_key),
        "-out",
        str(out.ca),
    )
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(out.key), "-out", str(csr)
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(out.ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "7",
        "-extfile",
        str(ext),
        "-out",
        str(out.cert),
    )
    return out
