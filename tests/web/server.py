"""The dashboard of the browser tests, served by uvicorn in a process of its own.

Actions are enabled; a request may act only when it carries the ``operator`` cookie with
the token given on the command line (a stand-in for the service's own login).
Run as ``python server.py --dsn DSN --table T --port P --token TOKEN``.
"""

from __future__ import annotations

import argparse
import hmac

import uvicorn
from starlette.requests import Request

import cronlock.web


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    args = parser.parse_args()

    def authorize(request: Request) -> bool:
        return hmac.compare_digest(request.cookies.get("operator", ""), args.token)

    app = cronlock.web.app(args.dsn, table=args.table, authorize=authorize, refresh=1.0)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
