"""The console as a test reaches it over HTTP: its token, and a client that keeps cookies
and follows no redirect.

Not here: the console's fixtures (tests/test_console.py), a real browser (browser.py).
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from http.cookiejar import CookieJar

TOKEN = "unit-test-token-0a9b8c7d"  # the consoles the tests start sign in with this


class Client:
    """urllib with cookies; no redirect followed, so a 303 is seen as one."""

    def __init__(self, url: str):
        self.url = url
        self.jar = CookieJar()

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args):
                return None

        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), NoRedirect)

    def get(self, path: str, **headers):
        return self._open(urllib.request.Request(self.url + path.lstrip("/"), headers=headers))

    def post(self, path: str, form: dict, **headers):
        body = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in form.items()).encode()
        return self._open(
            urllib.request.Request(
                self.url + path.lstrip("/"),
                data=body,
                method="POST",
                headers={"Content-Type": "application/x-www-form-urlencoded", **headers},
            )
        )

    def _open(self, request):
        try:
            with self.opener.open(request, timeout=30) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read().decode()

    def sign_in(self):
        status, headers, _ = self.post("/login", {"token": TOKEN, "next": "/"})
        assert status == 303 and headers["location"] == "/"
        return self

    @property
    def port(self) -> int:
        return int(self.url.rstrip("/").rsplit(":", 1)[1])

    def raw(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes | None = None):
        """One request with exactly these headers (Host included, or none): http.client, nothing added."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for key, value in headers:
                conn.putheader(key, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read().decode()
        finally:
            conn.close()
