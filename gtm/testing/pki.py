"""Old name of :mod:`gtm.pki`, kept so code that imports it keeps working: the module
is product code now (``gtm up`` uses it), and lives in the core."""

from gtm.pki import (
    CA_DAYS,
    LEAF_DAYS,
    CertificateAuthority,
    IssuedCert,
    LeafFiles,
    LocalPki,
    ensure_local_pki,
)

__all__ = [
    "CA_DAYS",
    "LEAF_DAYS",
    "CertificateAuthority",
    "IssuedCert",
    "LeafFiles",
    "LocalPki",
    "ensure_local_pki",
]
