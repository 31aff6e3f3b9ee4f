"""The HTTP client side shared by the services."""

from __future__ import annotations

import ssl

from fogshift.common.http import ServiceClient, tls_context


def test_every_client_shares_one_verifying_tls_context() -> None:
    context = tls_context()
    assert context is tls_context()  # built once per process, not per client
    # Shared, but not weakened: certificates and host names are still checked.
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    client = ServiceClient("https://127.0.0.1:1", "t" * 16, "node agent 'x'")
    try:
        pool = client._client._transport._pool  # type: ignore[attr-defined]
        assert pool._ssl_context is context
    finally:
        client._client.close()
