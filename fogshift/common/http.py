"""REST plumbing shared by the orchestrator and the node agents.

Every service requires ``Authorization: Bearer <token>``; every :class:`FogshiftError` is
sent as JSON with its HTTP status, and :func:`raise_for_error` turns such a response back
into the same error class on the client side.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from fogshift.exceptions import FogshiftError, InvalidInput, Unauthorized, Unavailable

_BY_CODE: dict[str, type[FogshiftError]] = {}


def _collect(cls: type[FogshiftError]) -> None:
    _BY_CODE.setdefault(cls.code, cls)
    for sub in cls.__subclasses__():
        _collect(sub)


def install_error_handlers(app: FastAPI, token: str) -> None:
    """Require the bearer token on every route and map errors to JSON responses."""

    @app.middleware("http")
    async def check_token(request: Request, call_next: Callable[[Request], Any]) -> Any:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            err = Unauthorized(
                "missing or wrong token",
                hint="the token is in the cluster file written by `fogshift up` (--home)",
            )
            return JSONResponse(err.to_dict(), status_code=err.http_status)
        return await call_next(request)

    @app.exception_handler(FogshiftError)
    async def fogshift_error(request: Request, exc: FogshiftError) -> JSONResponse:
        body = exc.to_dict()
        report = getattr(exc, "report", None)
        if report is not None:  # e.g. a failed migration's phase timings
            body["report"] = report.to_dict()
        return JSONResponse(body, status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        err = InvalidInput(
            f"bad request to {request.url.path}: "
            + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()),
            received=repr(first.get("input"))[:200],
        )
        return JSONResponse(err.to_dict(), status_code=err.http_status)


def raise_for_error(response: httpx.Response, what: str) -> None:
    """Raise the error an unsuccessful response carries, as its own class."""
    if response.is_success:
        return
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not _BY_CODE:
        _collect(FogshiftError)
    cls = _BY_CODE.get(str(body.get("code")), FogshiftError)
    error = cls(
        str(body.get("message") or f"{what} answered HTTP {response.status_code}"),
        expected=body.get("expected"),
        received=body.get("received"),
        hint=body.get("hint"),
    )
    error.details = body.get("report")  # type: ignore[attr-defined]
    raise error


class ServiceClient:
    """A small authenticated JSON client for one fogshift service.

    Args:
        url: The service's base URL.
        token: The bearer token.
        name: How the service is named in errors ("node agent fog-a").
        timeout_s: Per-request timeout.
    """

    def __init__(self, url: str, token: str, name: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.name = name
        self._client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    def raw(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request and return the successful response itself (binary bodies).

        Raises:
            Unavailable: The service cannot be reached.
            FogshiftError: The service's own error, re-raised as its class.
        """
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"{self.name} at {self.url} cannot be reached: {type(exc).__name__}",
                hint="is it running? `fogshift nodes` shows the node agents",
            ) from exc
        raise_for_error(response, self.name)
        return response

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send a request and return its JSON body (see :meth:`raw` for the errors)."""
        response = self.raw(method, path, **kwargs)
        return response.json() if response.content else None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> Any:
        return self.request("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.request("DELETE", path, **kwargs)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
