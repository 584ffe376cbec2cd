"""Every HTTP call the tool makes through urllib goes through `urlopen` here.

- A loopback address (its own trial servers, nginx, a vLLM server on this host) never goes
  through a proxy the environment names: urllib applies `http_proxy` to 127.0.0.1 unless
  `no_proxy` lists it, and behind a corporate proxy every readiness check would then time out.
  Other hosts (a watched production server, Prometheus, a webhook receiver) follow the
  environment's proxy settings as usual.
- `redirects=False` (webhooks): a 3xx answer is an HTTPError. urllib would otherwise repeat a
  POST answered 301/302/303 as a GET without its body, and the caller would read "sent".
"""

from __future__ import annotations

import ipaddress
import urllib.request
from urllib.parse import urlsplit


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises HTTPError(code) for the 3xx itself


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def urlopen(req: urllib.request.Request | str, timeout: float, redirects: bool = True):
    """urllib's urlopen, with loopback addresses never proxied and, optionally, no redirect followed."""
    url = req.full_url if isinstance(req, urllib.request.Request) else req
    handlers = [urllib.request.ProxyHandler({})] if is_loopback(url) else []
    if not redirects:
        handlers.append(_NoRedirect())
    return urllib.request.build_opener(*handlers).open(req, timeout=timeout)
