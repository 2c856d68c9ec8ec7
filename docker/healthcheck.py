#!/usr/bin/env python3
"""Container health check: exit 0 when GET URL answers 200 (and its body holds --expect), else print one line
and exit 1. The image has no curl; this is the standard library only and starts in well under a second.

    fractune-healthcheck http://127.0.0.1:8265/api/gcs_healthz --expect success     # Ray head (GCS)
    fractune-healthcheck http://127.0.0.1:52365/api/local_raylet_healthz --expect success   # any Ray node
    fractune-healthcheck http://127.0.0.1:5000/health                               # MLflow server

Ray keeps these health endpoints public under token authentication, so no token is sent. Proxy variables
are ignored: the check is always for this container.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request


def check(url: str, expect: str | None = None, timeout: float = 5.0) -> str | None:
    """None when healthy, else one line saying why."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            body = resp.read(65536).decode("utf-8", "replace")
            status = resp.status
    except urllib.error.HTTPError as e:
        return f"{url}: HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return f"{url}: {getattr(e, 'reason', e)}"
    if status != 200:
        return f"{url}: HTTP {status}"
    if expect is not None and expect not in body:
        return f"{url}: answer does not contain {expect!r}"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fractune-healthcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("--expect", help="text the answer must contain")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    args = p.parse_args(argv)
    problem = check(args.url, args.expect, args.timeout)
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
